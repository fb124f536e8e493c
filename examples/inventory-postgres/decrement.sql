-- Take one widget, holding the lock with fencing token $1. Applied only if no higher token
-- has written: a holder that paused past its lease (GC, swap, a stopped VM) and resumes
-- with its old token changes nothing. One row back = done; none = stale token or sold out.
UPDATE inventory
   SET stock = stock - 1, token = $1
 WHERE item = 'widget' AND stock > 0 AND token <= $1
RETURNING stock;
