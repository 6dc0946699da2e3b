#!/usr/bin/env bash
# Local Redis servers for the Redis store: a standalone server and a
# three-node cluster (no replicas), on 127.0.0.1 only, without persistence.
#
#   scripts/redis-servers.sh start    start them (just checks them if up)
#   scripts/redis-servers.sh stop     shut them all down
#   scripts/redis-servers.sh status   ping each one
#
# Environment:
#   REDIS_DIR            data, pid and log files (default /tmp/uffd-redis)
#   REDIS_PORT           the standalone server's port (default 6390)
#   REDIS_CLUSTER_PORTS  the cluster nodes' ports, space- or comma-separated
#                        (default "7000 7001 7002"; each also uses port+10000
#                        for the cluster bus)
#   REDIS_WAIT_S         how long start waits for cluster_state:ok (default 30)
set -euo pipefail

REDIS_DIR=${REDIS_DIR:-/tmp/uffd-redis}
REDIS_PORT=${REDIS_PORT:-6390}
read -r -a CLUSTER_PORTS <<<"${REDIS_CLUSTER_PORTS:-7000 7001 7002}"
if [[ ${#CLUSTER_PORTS[@]} -eq 1 && ${CLUSTER_PORTS[0]} == *,* ]]; then
    IFS=, read -r -a CLUSTER_PORTS <<<"${CLUSTER_PORTS[0]}"
fi
REDIS_WAIT_S=${REDIS_WAIT_S:-30}
HOST=127.0.0.1

die() { echo "redis-servers: $*" >&2; exit 1; }

for tool in redis-server redis-cli; do
    command -v "$tool" >/dev/null || die "$tool is not on PATH (apt-get install redis-server)"
done
[[ $REDIS_PORT =~ ^[0-9]+$ ]] && ((REDIS_PORT > 0 && REDIS_PORT < 65536)) ||
    die "bad port REDIS_PORT='$REDIS_PORT'"
for p in "${CLUSTER_PORTS[@]}"; do
    # The cluster bus listens on port+10000.
    [[ $p =~ ^[0-9]+$ ]] && ((p > 0 && p < 55536)) || die "bad cluster port '$p' (1-55535)"
done
((${#CLUSTER_PORTS[@]} >= 3)) || die "a cluster needs at least 3 ports (REDIS_CLUSTER_PORTS)"

cli() { redis-cli -h "$HOST" -p "$1" "${@:2}"; }
up() { [[ $(cli "$1" ping 2>/dev/null) == PONG ]]; }

cluster_url() {
    local IFS=,
    local nodes=("${CLUSTER_PORTS[@]/#/$HOST:}")
    echo "redis-cluster://${nodes[*]}"
}

print_urls() {
    echo "redis://$HOST:$REDIS_PORT"
    cluster_url
}

# start_node PORT [extra redis-server args...]
start_node() {
    local port=$1
    shift
    if up "$port"; then
        echo "port $port: already running"
        return
    fi
    local dir=$REDIS_DIR/$port
    mkdir -p "$dir"
    redis-server --port "$port" --bind "$HOST" --protected-mode yes \
        --save '' --appendonly no --daemonize yes \
        --dir "$dir" --pidfile "$dir/redis.pid" --logfile "$dir/redis.log" "$@" ||
        die "port $port: redis-server failed to start (see $dir/redis.log)"
    local i
    for ((i = 0; i < 100; i++)); do
        up "$port" && { echo "port $port: started"; return; }
        sleep 0.1
    done
    die "port $port: redis-server does not answer (see $dir/redis.log)"
}

cluster_ok() { cli "$1" cluster info 2>/dev/null | tr -d '\r' | grep -qx 'cluster_state:ok'; }

start() {
    mkdir -p "$REDIS_DIR"
    start_node "$REDIS_PORT"
    local p any=0
    for p in "${CLUSTER_PORTS[@]}"; do
        up "$p" && any=1
    done
    if ((any == 0)); then
        # No node is up (a fresh machine, or servers that were killed
        # rather than stopped): nothing is persisted, so start over rather
        # than from node files that may describe another cluster.
        for p in "${CLUSTER_PORTS[@]}"; do
            rm -f "$REDIS_DIR/$p/nodes-$p.conf"
        done
    fi
    for p in "${CLUSTER_PORTS[@]}"; do
        start_node "$p" --cluster-enabled yes \
            --cluster-config-file "$REDIS_DIR/$p/nodes-$p.conf" --cluster-node-timeout 5000
    done
    # Create the cluster unless its first node already knows the others
    # (a restart of a stopped cluster starts over: nothing is persisted,
    # and stop removes the node files).
    local known
    known=$(cli "${CLUSTER_PORTS[0]}" cluster info | tr -d '\r' | sed -n 's/^cluster_known_nodes://p')
    if [[ $known != "${#CLUSTER_PORTS[@]}" ]] || ! cluster_ok "${CLUSTER_PORTS[0]}"; then
        if [[ $known == 1 ]]; then
            echo "creating the cluster"
            redis-cli --cluster create "${CLUSTER_PORTS[@]/#/$HOST:}" \
                --cluster-replicas 0 --cluster-yes >"$REDIS_DIR/cluster-create.log" 2>&1 ||
                die "redis-cli --cluster create failed (see $REDIS_DIR/cluster-create.log)"
        fi
    fi
    local deadline=$((SECONDS + REDIS_WAIT_S))
    for p in "${CLUSTER_PORTS[@]}"; do
        until cluster_ok "$p"; do
            ((SECONDS < deadline)) ||
                die "cluster not ok after ${REDIS_WAIT_S}s (node $p: $(cli "$p" cluster info 2>&1 | tr -d '\r' | grep cluster_state || echo 'no answer'); try: $0 stop && $0 start)"
            sleep 0.2
        done
    done
    echo "cluster: cluster_state:ok"
    print_urls
}

stop_node() {
    local port=$1 dir=$REDIS_DIR/$1 pid=""
    [[ -f $dir/redis.pid ]] && pid=$(<"$dir/redis.pid")
    if up "$port"; then
        cli "$port" shutdown nosave >/dev/null 2>&1 || true
    fi
    if [[ -n $pid ]]; then
        local i
        for ((i = 0; i < 50; i++)); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.1
        done
        if kill -0 "$pid" 2>/dev/null; then
            kill "$pid" 2>/dev/null || true
            sleep 0.5
            kill -0 "$pid" 2>/dev/null && kill -9 "$pid" 2>/dev/null || true
        fi
    fi
    if up "$port"; then
        echo "port $port: still answering (not started by this script?)" >&2
        return 1
    fi
    rm -f "$dir/redis.pid" "$dir/nodes-$port.conf"
    echo "port $port: stopped"
}

stop() {
    local p rc=0
    for p in "$REDIS_PORT" "${CLUSTER_PORTS[@]}"; do
        stop_node "$p" || rc=1
    done
    return $rc
}

status() {
    local p rc=0
    if up "$REDIS_PORT"; then
        echo "redis://$HOST:$REDIS_PORT: up ($(cli "$REDIS_PORT" info server | tr -d '\r' | sed -n 's/^redis_version:/redis /p'))"
    else
        echo "redis://$HOST:$REDIS_PORT: down"
        rc=1
    fi
    for p in "${CLUSTER_PORTS[@]}"; do
        if up "$p"; then
            echo "cluster node $HOST:$p: up, $(cli "$p" cluster info | tr -d '\r' | grep '^cluster_state:')"
        else
            echo "cluster node $HOST:$p: down"
            rc=1
        fi
    done
    if ((rc == 0)) && cluster_ok "${CLUSTER_PORTS[0]}"; then
        print_urls
    fi
    return $rc
}

case ${1:-} in
start) start ;;
stop) stop ;;
status) status ;;
*)
    echo "usage: $0 start|stop|status" >&2
    exit 2
    ;;
esac
