-- The stock, and the highest fencing token that ever wrote it.
CREATE TABLE IF NOT EXISTS inventory (
    item  text   PRIMARY KEY,
    stock bigint NOT NULL CHECK (stock >= 0),
    token bigint NOT NULL DEFAULT 0
);
INSERT INTO inventory (item, stock) VALUES ('widget', 100) ON CONFLICT (item) DO NOTHING;
