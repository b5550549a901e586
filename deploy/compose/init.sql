CREATE TABLE accounts (
    id          bigint PRIMARY KEY,
    balance     numeric NOT NULL DEFAULT 0,
    fence_token bigint
);
INSERT INTO accounts (id, balance) VALUES (1, 100), (2, 100);
