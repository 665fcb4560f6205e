-- Least-privilege roles of the SQL store (conf/README.md "Least privilege"). Run once as an admin,
-- before the schema step. PostgreSQL syntax that CockroachDB (v21.2+) also takes; the tests
-- run this file as it is on PostgreSQL 15 (tests/test_least_privilege.py).
-- Passwords are set apart (ALTER ROLE fm_writer WITH PASSWORD '...'), or use certificates.
-- Another schema than public: replace it below and set sql.db_schema.

-- fm_schema owns the entity tables: `materialize schema` runs as it.
-- fm_writer runs the nightly job: it checks its table and reads and upserts rows, nothing else.
-- fm_reader is the read side's (reader.sql: the reader library, `materialize serve`): SELECT only.
-- fm_cleanup runs `materialize cleanup` (--sql-dsn): it deletes expired rows and rows of removed
-- sources, and removes JSON keys of removed features; no INSERT, TRUNCATE or DDL.
CREATE ROLE fm_schema LOGIN;
CREATE ROLE fm_writer LOGIN;
CREATE ROLE fm_reader LOGIN;
CREATE ROLE fm_cleanup LOGIN;

-- Only the owner role may create tables in the schema (PostgreSQL 15 already revokes
-- CREATE from PUBLIC; older servers let every role create tables in public).
REVOKE CREATE ON SCHEMA public FROM PUBLIC;
GRANT USAGE, CREATE ON SCHEMA public TO fm_schema;
GRANT USAGE ON SCHEMA public TO fm_writer;
GRANT USAGE ON SCHEMA public TO fm_reader;
GRANT USAGE ON SCHEMA public TO fm_cleanup;

-- Every table fm_schema creates (and owns: adding a column, or CockroachDB's row-level TTL, is
-- the schema step's): the writer's upsert (INSERT ... ON CONFLICT DO UPDATE) and the UPDATE that
-- moves an entity's expiry need SELECT, INSERT and UPDATE; SELECT also serves the read-back
-- check; CockroachDB's ALTER TABLE ... SPLIT AT needs INSERT. No DELETE, TRUNCATE or DDL.
ALTER DEFAULT PRIVILEGES FOR ROLE fm_schema IN SCHEMA public GRANT SELECT, INSERT, UPDATE ON TABLES TO fm_writer;
-- The read side only ever SELECTs: no INSERT, UPDATE, DELETE, TRUNCATE or DDL.
ALTER DEFAULT PRIVILEGES FOR ROLE fm_schema IN SCHEMA public GRANT SELECT ON TABLES TO fm_reader;
-- Cleanup reads pages of rows, deletes some and rewrites others' JSON: SELECT, UPDATE, DELETE.
ALTER DEFAULT PRIVILEGES FOR ROLE fm_schema IN SCHEMA public GRANT SELECT, UPDATE, DELETE ON TABLES TO fm_cleanup;
