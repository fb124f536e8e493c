-- One step of the report on slot $1 with token $2: refused once a later holder of the slot
-- has written (a builder that paused past its lease resumes and changes nothing).
UPDATE builder_slots
   SET progress = progress + 1
 WHERE slot = $1 AND token = $2
RETURNING progress;
