-- Start a report on permit slot $1, holding it with fencing token $2: applied only if no
-- higher token has written this slot's row. One row back = the slot is ours; none = a
-- later holder of this slot has written, and this hold is stale.
UPDATE builder_slots
   SET token = $2, report = $3, progress = 0
 WHERE slot = $1 AND token <= $2
RETURNING slot;
