#!/usr/bin/env bash
# The local stack without Docker: PostgreSQL from the distribution's packages and the official
# Apache Kafka broker (KRaft, jars from Maven Central), each with its own data under .stack/.
#
#   scripts/stack.sh up             start what is not running (idempotent), write .gangway/env
#   scripts/stack.sh down           stop what `up` started
#   scripts/stack.sh status         say what runs
#   scripts/stack.sh env            print the connection settings (the lines of .gangway/env)
#   scripts/stack.sh restart-kafka  stop and start the broker (the tests use it)
#   scripts/stack.sh kafka-stop|kafka-start|pg-stop|pg-start   one server (`make chaos` uses them)
#
# GANGWAY_PG_DSN / GANGWAY_KAFKA_BOOTSTRAP, when set, point at existing servers: then the
# matching local server is neither installed nor started.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# Both move for a second, independent stack (`make chaos` runs its own beside `make up`'s).
STACK="${GANGWAY_STACK_DIR:-$ROOT/.stack}"
GANGWAY_DIR="${GANGWAY_STACK_STATE_DIR:-$ROOT/.gangway}"

# Below Linux's ephemeral range (32768-60999): a client retrying a connection to a stopped
# server could otherwise be given the server's own port as its source port, and the restarted
# server would find its port taken.
# The ports this stack was last brought up on (.stack/ports) stand in for variables left unset,
# so `make status` and a later `make up` find a stack moved with them where it runs.
PORTS_FILE="$STACK/ports"
SAVED_PG_PORT="" SAVED_KAFKA_PORT="" SAVED_KAFKA_CONTROLLER_PORT=""
if [ -f "$PORTS_FILE" ]; then
    while IFS='=' read -r name value; do
        [[ "$value" =~ ^[0-9]+$ ]] || continue
        case "$name" in
            PG_PORT) SAVED_PG_PORT="$value" ;;
            KAFKA_PORT) SAVED_KAFKA_PORT="$value" ;;
            KAFKA_CONTROLLER_PORT) SAVED_KAFKA_CONTROLLER_PORT="$value" ;;
        esac
    done <"$PORTS_FILE"
fi
PG_PORT="${GANGWAY_STACK_PG_PORT:-${SAVED_PG_PORT:-25432}}"
KAFKA_PORT="${GANGWAY_STACK_KAFKA_PORT:-${SAVED_KAFKA_PORT:-29092}}"
KAFKA_CONTROLLER_PORT="${GANGWAY_STACK_KAFKA_CONTROLLER_PORT:-${SAVED_KAFKA_CONTROLLER_PORT:-29093}}"
# The API's URL: as given, else as .gangway/env already says (`make up` may have been given
# another), else the default.
SAVED_API_URL=""
if [ -f "$GANGWAY_DIR/env" ]; then
    SAVED_API_URL="$(sed -n 's/^GANGWAY_API_URL=//p' "$GANGWAY_DIR/env" | tail -n 1)"
fi
API_URL="${GANGWAY_API_URL:-${SAVED_API_URL:-http://127.0.0.1:8080}}"

PG_DIR="$STACK/pg"
PG_DATA="$PG_DIR/data"
PG_RUN="$PG_DIR/run"
PG_LOG="$PG_DIR/postgres.log"
PG_DB=gangway
# The roles' passwords are random, one per installation, in .stack/secrets (0700, files 0600):
# never in this script or another world-readable file, since ranks run on this machine too.
PG_OWNER=gangway_owner
PG_APP=gangway_app
SECRETS="$STACK/secrets"

# The password of role $1, generated on first use.
role_password() {
    local file="$SECRETS/$1.password"
    if [ ! -s "$file" ]; then
        (umask 077 && mkdir -p "$SECRETS" && od -An -N24 -tx1 /dev/urandom | tr -d ' \n' >"$file.tmp" \
            && mv "$file.tmp" "$file")
    fi
    chmod 700 "$SECRETS"
    chmod 600 "$file"
    cat "$file"
}
PG_OWNER_PASSWORD="$(role_password "$PG_OWNER")"
PG_APP_PASSWORD="$(role_password "$PG_APP")"

# The broker authenticates every client (SASL/SCRAM-SHA-256) and authorizes it (ACLs): the
# admin is its super user (the stack, topic creation, the tests); each role is one principal
# with only its own rights, granted per topic prefix by services/runtime/bus_acl.py. Their
# passwords are random, one per installation, beside the roles' (.stack/secrets, 0600).
KAFKA_SASL_MECHANISM=SCRAM-SHA-256
KAFKA_ADMIN=gangway_admin
KAFKA_ROLES="relay service agent"
KAFKA_ADMIN_PASSWORD="$(role_password "kafka_$KAFKA_ADMIN")"
kafka_role_password() { role_password "kafka_gangway_$1"; }

KAFKA_DIR="$STACK/kafka"
KAFKA_LIBS="$KAFKA_DIR/libs"
KAFKA_DATA="$KAFKA_DIR/data"
KAFKA_CONF="$KAFKA_DIR/server.properties"
KAFKA_LOG="$KAFKA_DIR/broker.log"
KAFKA_PID="$KAFKA_DIR/broker.pid"
KAFKA_POM="$ROOT/scripts/kafka/pom.xml"
# Written once the broker's data holds the SCRAM users (a data directory from before SASL has
# them added at its next start: kafka_add_users).
KAFKA_USERS_MARK="$KAFKA_DIR/data/.gangway-scram-users"
KAFKA_HEAP="${GANGWAY_STACK_KAFKA_HEAP:--Xms256m -Xmx768m}"
# services/runtime/limits.py MAX_MESSAGE_BYTES (2 MiB); tests/integration/test_bounds.py checks.
KAFKA_MAX_MESSAGE_BYTES=2097152

log() { printf '[stack] %s\n' "$*" >&2; }
die() { printf '[stack] error: %s\n' "$*" >&2; exit 1; }

is_root() { [ "$(id -u)" = 0 ]; }

apt_install() {
    is_root || die "missing $*; install it (apt-get install -y $*) or run as root"
    log "installing $* from the Debian packages"
    DEBIAN_FRONTEND=noninteractive apt-get update -qq
    # The postgresql package's own cluster is not ours; policy-rc.d keeps it from starting.
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# A server's port inside the ephemeral range can be taken, while the server is down, as the
# source port of a client reconnecting to it (seen: TIME-WAIT 127.0.0.1:39092 <-> :39092, and a
# broker that could not restart for minutes). Refuse such a port rather than find out later.
check_port() {
    local what="$1" port="$2" lo hi
    case "$port" in '' | *[!0-9]*) die "$what port '$port' is not a number" ;; esac
    read -r lo hi 2>/dev/null </proc/sys/net/ipv4/ip_local_port_range || return 0
    if [ "$port" -ge "$lo" ] && [ "$port" -le "$hi" ]; then
        die "$what port $port is inside Linux's ephemeral port range $lo-$hi (net.ipv4.ip_local_port_range): a reconnecting client may be given it as its source port while the server is down, and the server could not restart; choose a port below $lo (defaults: 25432, 29092, 29093)"
    fi
}

# ---------------------------------------------------------------- PostgreSQL

pg_bin() {
    local dir
    dir="$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)"
    [ -n "$dir" ] && [ -x "$dir/initdb" ] && printf '%s' "$dir"
}

ensure_pg_installed() {
    if [ -z "$(pg_bin)" ]; then
        apt_install postgresql
    fi
    [ -n "$(pg_bin)" ] || die "PostgreSQL server binaries not found after install"
}

# PostgreSQL refuses to run as root, so as root the server runs as the `postgres` OS user.
as_pg() {
    if is_root; then
        runuser -u postgres -- "$@"
    else
        "$@"
    fi
}

ensure_pg_user() {
    is_root || return 0
    if ! id postgres >/dev/null 2>&1; then
        useradd --system --home-dir /var/lib/postgresql --shell /bin/bash postgres
    fi
    # The data directory may sit under a private directory (mktemp -d is 0700): the server's
    # user needs to traverse every ancestor, and search permission alone lists nothing.
    local dir="$STACK"
    while [ "$dir" != "/" ]; do
        if ! runuser -u postgres -- test -x "$dir"; then
            chmod o+x "$dir"
        fi
        dir="$(dirname "$dir")"
    done
}

pg_running() {
    [ -f "$PG_DATA/postmaster.pid" ] && as_pg "$(pg_bin)/pg_ctl" -D "$PG_DATA" status >/dev/null 2>&1
}

pg_superuser_sql() {
    as_pg "$(pg_bin)/psql" -h "$PG_RUN" -p "$PG_PORT" -U postgres -d postgres -v ON_ERROR_STOP=1 -qtAc "$1"
}

pg_up() {
    ensure_pg_installed
    mkdir -p "$PG_DIR"
    ensure_pg_user
    if pg_running; then
        log "PostgreSQL already running on 127.0.0.1:$PG_PORT"
    else
        if port_open "$PG_PORT"; then
            die "port $PG_PORT is taken by another process; set GANGWAY_STACK_PG_PORT or GANGWAY_PG_DSN"
        fi
        mkdir -p "$PG_RUN"
        is_root && chown -R postgres: "$PG_DIR"
        if [ ! -f "$PG_DATA/PG_VERSION" ]; then
            log "initialising a PostgreSQL data directory in $PG_DATA"
            as_pg "$(pg_bin)/initdb" -D "$PG_DATA" -U postgres --auth-local=peer \
                --auth-host=scram-sha-256 -E UTF8 --locale=C.UTF-8 >/dev/null
            cat >>"$PG_DATA/postgresql.conf" <<EOF

# gangway local stack (port and socket directory are given at start: they may change)
listen_addresses = '127.0.0.1'
max_connections = 300
shared_buffers = 256MB
EOF
        fi
        is_root && chown -R postgres: "$PG_DIR"
        log "starting PostgreSQL on 127.0.0.1:$PG_PORT"
        as_pg "$(pg_bin)/pg_ctl" -D "$PG_DATA" -l "$PG_LOG" -w -t 60 \
            -o "-p $PG_PORT -k $PG_RUN" start >/dev/null 9>&- \
            || { tail -n 30 "$PG_LOG" >&2; die "PostgreSQL did not start"; }
    fi
    local i
    for i in $(seq 1 60); do
        if as_pg "$(pg_bin)/pg_isready" -q -h 127.0.0.1 -p "$PG_PORT"; then break; fi
        sleep 0.5
    done
    as_pg "$(pg_bin)/pg_isready" -q -h 127.0.0.1 -p "$PG_PORT" || die "PostgreSQL is not ready"
    pg_bootstrap
}

# Roles: the owner runs the migrations (and may create the tests' databases); the application
# role gets only what the migrations grant it, and never UPDATE/DELETE/TRUNCATE on the log.
pg_bootstrap() {
    pg_superuser_sql "DO \$\$ BEGIN
        IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '$PG_OWNER') THEN
            CREATE ROLE $PG_OWNER LOGIN CREATEDB PASSWORD '$PG_OWNER_PASSWORD';
        END IF;
        IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '$PG_APP') THEN
            CREATE ROLE $PG_APP LOGIN PASSWORD '$PG_APP_PASSWORD';
        END IF;
        -- DROP DATABASE … WITH (FORCE) by the owner (the tests' scratch databases) ends the
        -- sessions the application role still holds there, which takes this membership.
        IF NOT pg_has_role('$PG_OWNER', 'pg_signal_backend', 'MEMBER') THEN
            GRANT pg_signal_backend TO $PG_OWNER;
        END IF;
    END \$\$;"
    # The files are the truth: an installation from before them takes their passwords now.
    pg_superuser_sql "ALTER ROLE $PG_OWNER PASSWORD '$PG_OWNER_PASSWORD'"
    pg_superuser_sql "ALTER ROLE $PG_APP PASSWORD '$PG_APP_PASSWORD'"
    if [ -z "$(pg_superuser_sql "SELECT 1 FROM pg_database WHERE datname = '$PG_DB'")" ]; then
        pg_superuser_sql "CREATE DATABASE $PG_DB OWNER $PG_OWNER"
    fi
}

pg_down() {
    if [ -n "$(pg_bin)" ] && [ -f "$PG_DATA/postmaster.pid" ] && pg_running; then
        log "stopping PostgreSQL"
        as_pg "$(pg_bin)/pg_ctl" -D "$PG_DATA" -m fast -w -t 60 stop >/dev/null
    fi
}

# ---------------------------------------------------------------- Kafka

ensure_java() {
    command -v java >/dev/null 2>&1 || apt_install openjdk-17-jre-headless
    command -v mvn >/dev/null 2>&1 || apt_install maven
}

kafka_classpath() { printf '%s/*' "$KAFKA_LIBS"; }

ensure_kafka_jars() {
    local stamp="$KAFKA_LIBS/.pom.sha256" want
    want="$(sha256sum "$KAFKA_POM" | cut -d' ' -f1)"
    if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
        return 0
    fi
    ensure_java
    log "resolving the Apache Kafka broker jars from Maven Central (cached in ~/.m2)"
    rm -rf "$KAFKA_LIBS"
    mkdir -p "$KAFKA_DIR"
    mvn -B -Dstyle.color=never -f "$KAFKA_POM" dependency:copy-dependencies \
        -DoutputDirectory="$KAFKA_LIBS" -DincludeScope=runtime >"$KAFKA_DIR/mvn.log" 2>&1 \
        || { tail -n 30 "$KAFKA_DIR/mvn.log" >&2; die "mvn could not resolve the Kafka jars"; }
    printf '%s' "$want" >"$stamp"
}

kafka_pid() {
    [ -f "$KAFKA_PID" ] || return 1
    local pid
    pid="$(cat "$KAFKA_PID")"
    kill -0 "$pid" 2>/dev/null || return 1
    printf '%s' "$pid"
}

# $1: "sasl" (the normal configuration) or "open" (no authentication: used once, to add the
# SCRAM users to a data directory formatted before them).
write_kafka_config() {
    local mode="${1:-sasl}" security
    mkdir -p "$KAFKA_DIR"
    if [ "$mode" = sasl ]; then
        # The controller listener cannot use SCRAM (its credentials live in the metadata the
        # controller serves), so the broker reaches its controller with PLAIN, as the admin.
        security="listeners=SASL_PLAINTEXT://127.0.0.1:$KAFKA_PORT,CONTROLLER://127.0.0.1:$KAFKA_CONTROLLER_PORT
advertised.listeners=SASL_PLAINTEXT://127.0.0.1:$KAFKA_PORT
controller.listener.names=CONTROLLER
inter.broker.listener.name=SASL_PLAINTEXT
listener.security.protocol.map=CONTROLLER:SASL_PLAINTEXT,SASL_PLAINTEXT:SASL_PLAINTEXT
sasl.enabled.mechanisms=$KAFKA_SASL_MECHANISM
sasl.mechanism.inter.broker.protocol=$KAFKA_SASL_MECHANISM
listener.name.sasl_plaintext.sasl.enabled.mechanisms=$KAFKA_SASL_MECHANISM
listener.name.sasl_plaintext.scram-sha-256.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required username=\"$KAFKA_ADMIN\" password=\"$KAFKA_ADMIN_PASSWORD\";
sasl.mechanism.controller.protocol=PLAIN
listener.name.controller.sasl.enabled.mechanisms=PLAIN
listener.name.controller.plain.sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required username=\"$KAFKA_ADMIN\" password=\"$KAFKA_ADMIN_PASSWORD\" user_$KAFKA_ADMIN=\"$KAFKA_ADMIN_PASSWORD\";
authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer
super.users=User:$KAFKA_ADMIN
allow.everyone.if.no.acl.found=false"
    else
        security="listeners=PLAINTEXT://127.0.0.1:$KAFKA_PORT,CONTROLLER://127.0.0.1:$KAFKA_CONTROLLER_PORT
advertised.listeners=PLAINTEXT://127.0.0.1:$KAFKA_PORT
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT"
    fi
    # It holds the admin's password: readable by its owner only, from the first byte.
    (umask 077 && cat >"$KAFKA_CONF.tmp" <<EOF
# Generated by scripts/stack.sh: one combined broker + controller KRaft node on loopback.
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$KAFKA_CONTROLLER_PORT
$security
log.dirs=$KAFKA_DATA
num.partitions=3
default.replication.factor=1
min.insync.replicas=1
offsets.topic.replication.factor=1
offsets.topic.num.partitions=3
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
auto.create.topics.enable=true
log.retention.hours=168
# The bus's record bound, the same figure as services/runtime/limits.py's MAX_MESSAGE_BYTES
# (the topics are created with it too): above the largest event the log accepts.
message.max.bytes=$KAFKA_MAX_MESSAGE_BYTES
replica.fetch.max.bytes=$((KAFKA_MAX_MESSAGE_BYTES * 2))
EOF
    )
    chmod 600 "$KAFKA_CONF.tmp"
    mv "$KAFKA_CONF.tmp" "$KAFKA_CONF"
    cat >"$KAFKA_DIR/log4j2.properties" <<EOF
status = warn
appender.console.type = Console
appender.console.name = STDOUT
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.stdout.ref = STDOUT
logger.kafka.name = kafka
logger.kafka.level = INFO
logger.apache.name = org.apache.kafka
logger.apache.level = WARN
EOF
}

kafka_java() {
    # shellcheck disable=SC2086
    java $KAFKA_HEAP -XX:+UseG1GC -Djava.awt.headless=true \
        -Dlog4j2.configurationFile="$KAFKA_DIR/log4j2.properties" \
        -cp "$(kafka_classpath)" "$@"
}

# The SCRAM users, as `kafka-storage format --add-scram` and ConfigCommand take them.
kafka_scram_users() {
    local role
    printf '%s %s\n' "$KAFKA_ADMIN" "$KAFKA_ADMIN_PASSWORD"
    for role in $KAFKA_ROLES; do
        printf 'gangway_%s %s\n' "$role" "$(kafka_role_password "$role")"
    done
}

kafka_format() {
    if [ -f "$KAFKA_DATA/meta.properties" ]; then
        return 0
    fi
    local cluster_id user password
    local -a scram=()
    while read -r user password; do
        scram+=(--add-scram "$KAFKA_SASL_MECHANISM=[name=$user,password=$password]")
    done < <(kafka_scram_users)
    cluster_id="$(kafka_java kafka.tools.StorageTool random-uuid | tail -n 1)"
    log "formatting the KRaft log directory (cluster $cluster_id) with the SCRAM users"
    kafka_java kafka.tools.StorageTool format -t "$cluster_id" -c "$KAFKA_CONF" "${scram[@]}" \
        >>"$KAFKA_LOG" 2>&1 || { tail -n 30 "$KAFKA_LOG" >&2; die "kafka storage format failed"; }
    touch "$KAFKA_USERS_MARK"
}

# A data directory formatted before authentication has no SCRAM users: start the broker once
# without authentication, add them through the admin API, stop it.
kafka_add_users() {
    local user password
    log "adding the SCRAM users to the broker's data (formatted before authentication)"
    write_kafka_config open
    kafka_launch
    while read -r user password; do
        kafka_java kafka.admin.ConfigCommand --bootstrap-server "127.0.0.1:$KAFKA_PORT" --alter \
            --add-config "$KAFKA_SASL_MECHANISM=[password=$password]" \
            --entity-type users --entity-name "$user" >>"$KAFKA_LOG" 2>&1 \
            || { kafka_stop; die "could not add the SCRAM user $user (see $KAFKA_LOG)"; }
    done < <(kafka_scram_users)
    kafka_stop
    touch "$KAFKA_USERS_MARK"
}

kafka_authenticates() { grep -q '^sasl.enabled.mechanisms=' "$KAFKA_CONF" 2>/dev/null; }

kafka_start() {
    # The broker's directory holds its log segments (every event of every team: job specs,
    # their env and commands) and its log: only the stack's own user may enter it. Created
    # with the default umask it was world-readable, and a rank, sandboxed as its team's user
    # with a read-only view of the host, read any other team's jobs from it.
    mkdir -p "$KAFKA_DIR"
    chmod 700 "$KAFKA_DIR"
    if kafka_pid >/dev/null; then
        if kafka_authenticates; then
            log "Kafka already running on 127.0.0.1:$KAFKA_PORT"
            return 0
        fi
        log "Kafka runs without authentication (an older configuration); restarting it with SASL"
        kafka_stop
    fi
    if port_open "$KAFKA_PORT" || port_open "$KAFKA_CONTROLLER_PORT"; then
        die "port $KAFKA_PORT or $KAFKA_CONTROLLER_PORT is taken; set GANGWAY_STACK_KAFKA_PORT or GANGWAY_KAFKA_BOOTSTRAP"
    fi
    ensure_java
    ensure_kafka_jars
    if [ -f "$KAFKA_DATA/meta.properties" ] && [ ! -f "$KAFKA_USERS_MARK" ]; then
        kafka_add_users
    fi
    write_kafka_config sasl
    kafka_format
    kafka_launch
}

kafka_launch() {
    log "starting Kafka (KRaft) on 127.0.0.1:$KAFKA_PORT, logging to $KAFKA_LOG"
    local mark
    mark="$(wc -l <"$KAFKA_LOG" 2>/dev/null || echo 0)"
    # setsid: the broker outlives the shell that started it and ignores its Ctrl-C.
    # shellcheck disable=SC2086
    setsid java $KAFKA_HEAP -XX:+UseG1GC -Djava.awt.headless=true \
        -Dlog4j2.configurationFile="$KAFKA_DIR/log4j2.properties" \
        -cp "$(kafka_classpath)" kafka.Kafka "$KAFKA_CONF" </dev/null >>"$KAFKA_LOG" 2>&1 9>&- &
    echo $! >"$KAFKA_PID"
    local i
    for i in $(seq 1 600); do
        if ! kafka_pid >/dev/null; then
            tail -n 40 "$KAFKA_LOG" >&2
            die "Kafka exited while starting"
        fi
        # grep without -q reads all of its input: with -q it would stop at the match and
        # tail, killed by SIGPIPE, would fail the pipeline (pipefail) on a long log.
        if tail -n "+$((mark + 1))" "$KAFKA_LOG" | grep "Kafka Server started" >/dev/null \
            && port_open "$KAFKA_PORT"; then
            return 0
        fi
        sleep 0.5
    done
    die "Kafka did not become ready in 300 s (see $KAFKA_LOG)"
}

kafka_stop() {
    local pid i
    pid="$(kafka_pid)" || { rm -f "$KAFKA_PID"; return 0; }
    log "stopping Kafka"
    kill -TERM "$pid"
    for i in $(seq 1 120); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.5
    done
    if kill -0 "$pid" 2>/dev/null; then
        log "Kafka ignored SIGTERM for 60 s; killing it"
        kill -KILL "$pid"
    fi
    rm -f "$KAFKA_PID"
}

# ---------------------------------------------------------------- commands

pg_dsn() {
    printf '%s' "${GANGWAY_PG_DSN:-postgresql://$PG_APP:$PG_APP_PASSWORD@127.0.0.1:$PG_PORT/$PG_DB}"
}

pg_owner_dsn() {
    if pg_external; then
        printf '%s' "${GANGWAY_PG_OWNER_DSN:-$GANGWAY_PG_DSN}"
    else
        printf '%s' "postgresql://$PG_OWNER:$PG_OWNER_PASSWORD@127.0.0.1:$PG_PORT/$PG_DB"
    fi
}

kafka_bootstrap() { printf '%s' "${GANGWAY_KAFKA_BOOTSTRAP:-127.0.0.1:$KAFKA_PORT}"; }

# Settings that name the local stack itself (e.g. sourced from .gangway/env) are not external.
pg_external() {
    [ -n "${GANGWAY_PG_DSN:-}" ] \
        && [ "$GANGWAY_PG_DSN" != "postgresql://$PG_APP:$PG_APP_PASSWORD@127.0.0.1:$PG_PORT/$PG_DB" ]
}

kafka_external() {
    [ -n "${GANGWAY_KAFKA_BOOTSTRAP:-}" ] && [ "$GANGWAY_KAFKA_BOOTSTRAP" != "127.0.0.1:$KAFKA_PORT" ]
}

# The broker's credentials: the admin's as the default ones (the CLI, the tests, the launcher,
# which hands each service its role's own: gangway/launcher.py), the roles' for the launcher.
# An external broker's are passed on as given (none: no authentication).
print_kafka_auth() {
    local role var
    if kafka_external; then
        for var in GANGWAY_KAFKA_SASL_MECHANISM GANGWAY_KAFKA_USERNAME GANGWAY_KAFKA_PASSWORD \
            GANGWAY_KAFKA_RELAY_PASSWORD GANGWAY_KAFKA_SERVICE_PASSWORD GANGWAY_KAFKA_AGENT_PASSWORD; do
            [ -n "${!var:-}" ] && printf '%s=%s\n' "$var" "${!var}"
        done
        return 0
    fi
    printf 'GANGWAY_KAFKA_SASL_MECHANISM=%s\n' "$KAFKA_SASL_MECHANISM"
    printf 'GANGWAY_KAFKA_USERNAME=%s\n' "$KAFKA_ADMIN"
    printf 'GANGWAY_KAFKA_PASSWORD=%s\n' "$KAFKA_ADMIN_PASSWORD"
    for role in $KAFKA_ROLES; do
        printf 'GANGWAY_KAFKA_%s_PASSWORD=%s\n' "${role^^}" "$(kafka_role_password "$role")"
    done
}

print_env() {
    printf 'GANGWAY_PG_DSN=%s\n' "$(pg_dsn)"
    printf 'GANGWAY_PG_OWNER_DSN=%s\n' "$(pg_owner_dsn)"
    printf 'GANGWAY_KAFKA_BOOTSTRAP=%s\n' "$(kafka_bootstrap)"
    print_kafka_auth
    printf 'GANGWAY_API_URL=%s\n' "$API_URL"
}

# The agent sandboxes each rank with bubblewrap where it works (services/agent/isolation.py);
# without it ranks are still isolated by users and file modes, so a failed install is no error.
ensure_bwrap() {
    command -v bwrap >/dev/null 2>&1 && return 0
    if is_root && command -v apt-get >/dev/null 2>&1; then
        log "installing bubblewrap (the ranks' sandbox) from the Debian packages"
        { DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap >/dev/null 2>&1 \
            || { DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null 2>&1 \
                && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap >/dev/null 2>&1; }; } \
            || log "bubblewrap could not be installed; ranks run without the sandbox"
    else
        log "bubblewrap is missing; ranks run without the sandbox (apt-get install bubblewrap)"
    fi
}

# The lines of .gangway/env whose keys print_env does not write.
other_env_lines() {
    [ -f "$GANGWAY_DIR/env" ] || return 0
    local written line
    written=" $(print_env | cut -d= -f1 | tr '\n' ' ') "
    while IFS= read -r line || [ -n "$line" ]; do
        [ -n "$line" ] || continue
        case "$written" in
            *" ${line%%=*} "*) ;;
            *) printf '%s\n' "$line" ;;
        esac
    done <"$GANGWAY_DIR/env"
}

cmd_up() {
    mkdir -p "$STACK" "$GANGWAY_DIR"
    pg_external || check_port PostgreSQL "$PG_PORT"
    if ! kafka_external; then
        check_port Kafka "$KAFKA_PORT"
        check_port "Kafka controller" "$KAFKA_CONTROLLER_PORT"
    fi
    ensure_bwrap
    if pg_external; then
        log "using the PostgreSQL at GANGWAY_PG_DSN"
    else
        pg_up
    fi
    if kafka_external; then
        log "using the Kafka at GANGWAY_KAFKA_BOOTSTRAP ($GANGWAY_KAFKA_BOOTSTRAP)"
    else
        kafka_start
    fi
    # It holds the owner role's password: readable by its owner only, from the first byte.
    # The lines it does not write (the launcher's, e.g. GANGWAY_PROMETHEUS_URL) are kept.
    (umask 077 && { print_env; other_env_lines; } >"$GANGWAY_DIR/env.tmp")
    chmod 600 "$GANGWAY_DIR/env.tmp"
    mv "$GANGWAY_DIR/env.tmp" "$GANGWAY_DIR/env"
    printf 'PG_PORT=%s\nKAFKA_PORT=%s\nKAFKA_CONTROLLER_PORT=%s\n' \
        "$PG_PORT" "$KAFKA_PORT" "$KAFKA_CONTROLLER_PORT" >"$PORTS_FILE"
    log "stack ready; settings in .gangway/env"
}

cmd_down() {
    kafka_stop
    pg_down
    rm -f "$PORTS_FILE"
}

cmd_status() {
    if [ -n "$(pg_bin)" ] && pg_running; then
        echo "postgres: running on 127.0.0.1:$PG_PORT"
    else
        echo "postgres: stopped"
    fi
    if pid="$(kafka_pid)"; then
        echo "kafka: running on 127.0.0.1:$KAFKA_PORT (pid $pid)"
    else
        echo "kafka: stopped"
    fi
}

# Several shells (tests, `make up`, a broker restart) may drive the stack at once: one at a time.
# The servers started under the lock must not inherit its descriptor (hence `9>&-` there).
with_lock() {
    mkdir -p "$STACK"
    exec 9>"$STACK/.lock"
    flock 9
    "$@"
}

case "${1:-}" in
    up) with_lock cmd_up ;;
    down) with_lock cmd_down ;;
    status) cmd_status ;;
    env) print_env ;;
    restart-kafka)
        kafka_external && die "GANGWAY_KAFKA_BOOTSTRAP is external; not ours to restart"
        check_port Kafka "$KAFKA_PORT"
        check_port "Kafka controller" "$KAFKA_CONTROLLER_PORT"
        with_lock kafka_stop
        with_lock kafka_start
        ;;
    kafka-stop)
        kafka_external && die "GANGWAY_KAFKA_BOOTSTRAP is external; not ours to stop"
        with_lock kafka_stop
        ;;
    kafka-start)
        kafka_external && die "GANGWAY_KAFKA_BOOTSTRAP is external; not ours to start"
        check_port Kafka "$KAFKA_PORT"
        with_lock kafka_start
        ;;
    pg-stop)
        pg_external && die "GANGWAY_PG_DSN is external; not ours to stop"
        with_lock pg_down
        ;;
    pg-start)
        pg_external && die "GANGWAY_PG_DSN is external; not ours to start"
        check_port PostgreSQL "$PG_PORT"
        with_lock pg_up
        ;;
    *) die "usage: $0 up|down|status|env|restart-kafka|kafka-stop|kafka-start|pg-stop|pg-start" ;;
esac
