-- 003_author: who wrote each message (the token's sub claim). NULL for
-- messages stored without auth (--insecure-no-auth) and before this
-- migration. Shipped: never edit.
ALTER TABLE messages ADD COLUMN author text;
ALTER TABLE inbox ADD COLUMN author text;
