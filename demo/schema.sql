-- The demo's sample database: a small product catalog.
-- Loaded by demo/sample.py into its own database (`demo`), then captured by the reader.

CREATE TABLE categories (
    id         int PRIMARY KEY,
    name       text NOT NULL UNIQUE,
    parent_id  int REFERENCES categories (id)
);

CREATE TABLE products (
    id          int PRIMARY KEY,
    sku         text NOT NULL UNIQUE,
    category_id int NOT NULL REFERENCES categories (id),
    title       text NOT NULL,
    -- Some descriptions are > 8 kB of incompressible text: PostgreSQL stores them out of
    -- line in the TOAST table, so updates that leave them alone send "unchanged TOAST".
    description text,
    price       numeric(10, 2) NOT NULL CHECK (price >= 0),
    active      boolean NOT NULL DEFAULT true,
    updated_at  timestamptz NOT NULL DEFAULT now()
);

-- ON UPDATE CASCADE: a product's primary-key change also changes the key of its stock rows.
CREATE TABLE stock_levels (
    product_id  int NOT NULL REFERENCES products (id) ON UPDATE CASCADE ON DELETE CASCADE,
    warehouse   text NOT NULL,
    quantity    int NOT NULL CHECK (quantity >= 0),
    reserved    int NOT NULL DEFAULT 0,
    updated_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (product_id, warehouse)
);
-- Old rows travel whole in update/delete events (pgoutput's "O" tuple).
ALTER TABLE stock_levels REPLICA IDENTITY FULL;

CREATE TABLE customers (
    id             int PRIMARY KEY,
    email          text NOT NULL UNIQUE,
    name           text NOT NULL,
    city           text,
    loyalty_points int NOT NULL DEFAULT 0,
    created_at     timestamptz NOT NULL DEFAULT now()
);
