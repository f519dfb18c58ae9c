#!/usr/bin/env bash
# A real Kubernetes control plane on loopback for the end-to-end tests (tests/e2e_*.rs):
# etcd, kube-apiserver and kube-controller-manager, built from their Go modules here
# (go.mod, etcd/go.mod). No kubelet, no scheduler, no container runtime: the tests bring
# their own small kubelet where they need pods to run.
#
#   tests/cluster/cluster.sh build    # Go builds into target/cluster/bin (Go's build cache is reused)
#   tests/cluster/cluster.sh up       # fresh certificates and data, start, wait for /readyz
#   tests/cluster/cluster.sh status   # which processes run; /readyz
#   tests/cluster/cluster.sh down     # stop them by PID
#
# `up` writes target/cluster/kubeconfig (the cluster admin, a client certificate in
# system:masters) and target/cluster/tokens.csv (bearer tokens of two plain users the tests
# bind to `edit` and `view`). kube-apiserver reaches webhook Services through their
# EndpointSlices (--enable-aggregator-routing: there is no kube-proxy to route a ClusterIP),
# so a webhook behind its Service is called at the address of a ready endpoint. Ports: $VRAMGUARD_CLUSTER_PORT (kube-apiserver, default 16443),
# $VRAMGUARD_ETCD_PORT (etcd clients, default 12379; peers on the next port).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
HERE="$ROOT/tests/cluster"
OUT="$ROOT/target/cluster"
BIN="$OUT/bin"
RUN="$OUT/run"
API_PORT="${VRAMGUARD_CLUSTER_PORT:-16443}"
ETCD_PORT="${VRAMGUARD_ETCD_PORT:-12379}"
ETCD_PEER_PORT=$((ETCD_PORT + 1))
KUBE_VERSION=v1.34.4
COMPONENTS=(etcd kube-apiserver kube-controller-manager)

log() { echo "cluster.sh: $*" >&2; }

build() {
    mkdir -p "$BIN"
    # The version the binaries report (/version, and the compatibility checks between them).
    local v=k8s.io/component-base/version
    local ldflags="-s -w -X $v.gitVersion=$KUBE_VERSION -X $v.gitMajor=1 -X $v.gitMinor=34 -X $v.gitTreeState=clean"
    (cd "$HERE" && go build -trimpath -buildvcs=false -ldflags "$ldflags" -o "$BIN/" \
        k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager)
    (cd "$HERE/etcd" && go build -trimpath -buildvcs=false -ldflags "-s -w" -o "$BIN/etcd" go.etcd.io/etcd/server/v3)
    log "built $(ls "$BIN" | tr '\n' ' ')in $BIN"
}

# A key and a certificate signed by the test CA. $1 name, $2 subject, $3 extensions.
cert() {
    local name=$1 subj=$2 ext=$3
    openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
        -keyout "$RUN/pki/$name.key" -subj "$subj" -out "$RUN/pki/$name.csr" 2>/dev/null
    printf '%s\n' "$ext" >"$RUN/pki/$name.ext"
    openssl x509 -req -in "$RUN/pki/$name.csr" -CA "$RUN/pki/ca.crt" -CAkey "$RUN/pki/ca.key" \
        -CAcreateserial -days 30 -sha256 -extfile "$RUN/pki/$name.ext" \
        -out "$RUN/pki/$name.crt" 2>/dev/null
}

pki() {
    mkdir -p "$RUN/pki"
    openssl req -x509 -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
        -keyout "$RUN/pki/ca.key" -subj "/CN=vramguard-test-ca" -days 30 -sha256 \
        -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
        -out "$RUN/pki/ca.crt" 2>/dev/null
    local client="basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature
extendedKeyUsage=clientAuth"
    cert apiserver "/CN=kube-apiserver" "basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature
extendedKeyUsage=serverAuth
subjectAltName=IP:127.0.0.1,IP:10.96.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc"
    cert admin "/O=system:masters/CN=vramguard-test-admin" "$client"
    cert controller-manager "/CN=system:kube-controller-manager" "$client"
    # The service-account token signing key.
    openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out "$RUN/pki/sa.key" 2>/dev/null
    openssl pkey -in "$RUN/pki/sa.key" -pubout -out "$RUN/pki/sa.pub" 2>/dev/null
    # Two plain users for the RBAC tests: token,user,uid,"groups".
    printf '%s,editor,editor,"vramguard:test-users"\n%s,viewer,viewer,"vramguard:test-users"\n' \
        "$(openssl rand -hex 16)" "$(openssl rand -hex 16)" >"$RUN/pki/tokens.csv"
    cp "$RUN/pki/tokens.csv" "$OUT/tokens.csv"
}

# A kubeconfig for client certificate $2, written to $1.
kubeconfig() {
    local file=$1 name=$2
    cat >"$file" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: vramguard-test
  cluster:
    server: https://127.0.0.1:$API_PORT
    certificate-authority-data: $(base64 -w0 <"$RUN/pki/ca.crt")
users:
- name: $name
  user:
    client-certificate-data: $(base64 -w0 <"$RUN/pki/$name.crt")
    client-key-data: $(base64 -w0 <"$RUN/pki/$name.key")
contexts:
- name: vramguard-test
  context: {cluster: vramguard-test, user: $name}
current-context: vramguard-test
EOF
}

start() {
    local name=$1
    shift
    "$BIN/$name" "$@" >"$RUN/$name.log" 2>&1 &
    echo $! >"$RUN/$name.pid"
}

alive() {
    local pidfile="$RUN/$1.pid"
    [[ -f $pidfile ]] && kill -0 "$(cat "$pidfile")" 2>/dev/null
}

readyz() {
    curl -sf --max-time 5 --cacert "$RUN/pki/ca.crt" --cert "$RUN/pki/admin.crt" \
        --key "$RUN/pki/admin.key" "https://127.0.0.1:$API_PORT/readyz" >/dev/null
}

# Waits up to $2 seconds for command $1; fails naming the log to read.
wait_for() {
    local what=$1 secs=$2 log=$3
    local deadline=$((SECONDS + secs))
    until "$what"; do
        if ((SECONDS >= deadline)); then
            log "$what: not ready after ${secs}s; the last lines of $log:"
            tail -n 30 "$log" >&2
            return 1
        fi
        sleep 0.5
    done
}

etcd_healthy() {
    alive etcd && curl -sf --max-time 2 "http://127.0.0.1:$ETCD_PORT/health" | grep -q '"health":"true"'
}

apiserver_ready() { alive kube-apiserver && readyz; }

up() {
    for c in "${COMPONENTS[@]}"; do
        [[ -x $BIN/$c ]] || { log "$BIN/$c is missing: run tests/cluster/cluster.sh build"; exit 1; }
    done
    if alive kube-apiserver || alive etcd || alive kube-controller-manager; then
        log "already running (tests/cluster/cluster.sh down first)"
        exit 1
    fi
    rm -rf "$RUN" "$OUT/kubeconfig"
    mkdir -p "$RUN"
    pki
    local started=$SECONDS
    start etcd --name default --data-dir "$RUN/etcd" \
        --listen-client-urls "http://127.0.0.1:$ETCD_PORT" \
        --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
        --listen-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
        --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
        --initial-cluster "default=http://127.0.0.1:$ETCD_PEER_PORT" \
        --unsafe-no-fsync --log-level warn
    wait_for etcd_healthy 60 "$RUN/etcd.log"
    start kube-apiserver \
        --etcd-servers "http://127.0.0.1:$ETCD_PORT" \
        --bind-address 127.0.0.1 --advertise-address 127.0.0.1 --secure-port "$API_PORT" \
        --tls-cert-file "$RUN/pki/apiserver.crt" --tls-private-key-file "$RUN/pki/apiserver.key" \
        --client-ca-file "$RUN/pki/ca.crt" \
        --token-auth-file "$RUN/pki/tokens.csv" \
        --service-account-key-file "$RUN/pki/sa.pub" \
        --service-account-signing-key-file "$RUN/pki/sa.key" \
        --service-account-issuer https://kubernetes.default.svc \
        --service-cluster-ip-range 10.96.0.0/16 \
        --authorization-mode RBAC \
        --enable-admission-plugins NamespaceLifecycle,ServiceAccount,PodSecurity,ValidatingAdmissionWebhook,MutatingAdmissionWebhook,ValidatingAdmissionPolicy,ResourceQuota,LimitRanger \
        --allow-privileged=true --profiling=false \
        --enable-aggregator-routing=true \
        --enable-priority-and-fairness=false \
        --v 1
    wait_for apiserver_ready 180 "$RUN/kube-apiserver.log"
    kubeconfig "$RUN/controller-manager.kubeconfig" controller-manager
    # Leader election off (one replica); controllers with their own service accounts, as
    # in a real cluster; no serving port (nothing scrapes it here).
    start kube-controller-manager \
        --kubeconfig "$RUN/controller-manager.kubeconfig" \
        --authentication-kubeconfig "$RUN/controller-manager.kubeconfig" \
        --authorization-kubeconfig "$RUN/controller-manager.kubeconfig" \
        --leader-elect=false --use-service-account-credentials=true \
        --service-account-private-key-file "$RUN/pki/sa.key" \
        --root-ca-file "$RUN/pki/ca.crt" \
        --cluster-signing-cert-file "$RUN/pki/ca.crt" --cluster-signing-key-file "$RUN/pki/ca.key" \
        --secure-port 0 --v 1
    kubeconfig "$OUT/kubeconfig" admin
    sleep 1
    alive kube-controller-manager || {
        log "kube-controller-manager exited; the last lines of $RUN/kube-controller-manager.log:"
        tail -n 30 "$RUN/kube-controller-manager.log" >&2
        exit 1
    }
    log "up in $((SECONDS - started))s: KUBECONFIG=$OUT/kubeconfig (logs in $RUN)"
}

down() {
    local c pid
    for c in kube-controller-manager kube-apiserver etcd; do
        if alive "$c"; then
            pid=$(cat "$RUN/$c.pid")
            kill "$pid"
            for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
            kill -0 "$pid" 2>/dev/null && kill -9 "$pid"
            log "stopped $c ($pid)"
        fi
        rm -f "$RUN/$c.pid"
    done
}

status() {
    local c rc=0
    for c in "${COMPONENTS[@]}"; do
        if alive "$c"; then echo "$c: running ($(cat "$RUN/$c.pid"))"; else echo "$c: stopped"; rc=1; fi
    done
    if alive kube-apiserver && readyz; then echo "readyz: ok"; else echo "readyz: not ready"; rc=1; fi
    return $rc
}

case "${1:-}" in
build) build ;;
up) up ;;
down) down ;;
status) status ;;
*)
    echo "usage: tests/cluster/cluster.sh build|up|down|status" >&2
    exit 2
    ;;
esac
