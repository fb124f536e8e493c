-- Before acting on a new hold (reading the stock, deciding, then writing): raise the row's
-- token to ours and change nothing else. From then on a write of an earlier holder that is
-- still in flight (it paused past its lease) is refused, even one that would otherwise
-- land before our first real write. One row back = fenced; none = a higher token has
-- already written, so this hold is stale.
UPDATE inventory
   SET token = $1
 WHERE item = 'widget' AND token <= $1
RETURNING token;
