-- One row per permit slot: the report its builder is working on, and the highest fencing
-- token that ever wrote the row. Holders of different slots hold different tokens at the
-- same time, so each checks its own slot's row, never one row shared by all.
CREATE TABLE IF NOT EXISTS builder_slots (
    slot     int    PRIMARY KEY CHECK (slot >= 0 AND slot < 3),
    token    bigint NOT NULL DEFAULT 0,
    report   text,
    progress int    NOT NULL DEFAULT 0
);
INSERT INTO builder_slots (slot) VALUES (0), (1), (2) ON CONFLICT (slot) DO NOTHING;
