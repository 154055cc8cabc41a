-- Run once by the postgres image on an empty volume (docker-compose.yml): the services' role.
-- The tables and its privileges come from the migrations, applied by the owner at start.
CREATE ROLE gangway_app LOGIN PASSWORD 'gangway_app';
ALTER ROLE gangway_owner CREATEDB;
GRANT pg_signal_backend TO gangway_owner;
