#!/usr/bin/env bash
# A real Kubernetes control plane on loopback for the end-to-end tests (tests/e2e_*.rs):
# etcd, kube-apiserver and kube-controller-manager, built from their Go modules here
# (go.mod, etcd/go.mod). No kubelet, no scheduler, no container runtime: the tests bring
# their own small kubelet where they need pods to run.
#
#   tests/cluster/cluster.sh build    # Go builds into target/cluster/bin (Go's build cache is reused)
#   tests/cluster/cluster.sh up       # fresh certificates and data, start, wait for /readyz
#   tests/cluster/cluster.sh kueue-up # Kueue (kueue/go.mod) on the running control plane
#   tests/cluster/cluster.sh status   # which processes run; /readyz
#   tests/cluster/cluster.sh down     # stop them by PID (Kueue first)
#
# `up` writes target/cluster/kubeconfig (the cluster admin, a client certificate in
# system:masters) and target/cluster/tokens.csv (bearer tokens of two plain users the tests
# bind to `edit` and `view`). kube-apiserver reaches webhook Services through their
# EndpointSlices (--enable-aggregator-routing: there is no kube-proxy to route a ClusterIP),
# so a webhook behind its Service is called at the address of a ready endpoint. Ports: $VRAMGUARD_CLUSTER_PORT (kube-apiserver, default 16443),
# $VRAMGUARD_ETCD_PORT (etcd clients, default 12379; peers on the next port),
# $VRAMGUARD_KUEUE_PORT (Kueue's webhooks, default 16543; its health probes and metrics on
# the next two ports).
#
# `kueue-up` installs Kueue's CRDs (those of the release built) with their conversion
# webhook, registers Kueue's Job mutating webhook (for Jobs labelled
# kueue.x-k8s.io/queue-name only) and starts the Kueue manager: the batch/job integration,
# manageJobsWithoutQueueName false, leader election off, its internal certificate
# management off (its webhooks serve a certificate of the test CA, called by `url:` on
# loopback: there is no kube-proxy) and the on-demand visibility server off. It is a
# client in system:masters, as the control plane's admin is. Kueue reads its metrics
# certificate from the fixed path /etc/kueue/metrics/certs (where its Deployment mounts a
# Secret); `kueue-up` writes the test CA's certificate there.
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
KUEUE_PORT="${VRAMGUARD_KUEUE_PORT:-16543}"
KUEUE_HEALTH_PORT=$((KUEUE_PORT + 1))
KUEUE_METRICS_PORT=$((KUEUE_PORT + 2))
KUEUE_VERSION=v0.17.0
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
    (cd "$HERE/kueue" && go build -trimpath -buildvcs=false \
        -ldflags "-s -w -X sigs.k8s.io/kueue/pkg/version.GitVersion=$KUEUE_VERSION" \
        -o "$BIN/kueue" sigs.k8s.io/kueue/cmd/kueue)
    # Kueue's CRDs, from the module of the release built.
    local src
    src="$(cd "$HERE/kueue" && go list -m -f '{{.Dir}}' sigs.k8s.io/kueue)/config/components/crd/bases"
    rm -rf "$OUT/kueue-crds"
    mkdir -p "$OUT/kueue-crds"
    cp "$src"/*.yaml "$OUT/kueue-crds/"
    chmod u+w "$OUT/kueue-crds"/*.yaml
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

# A request to the API server as the admin: $1 method, $2 path, $3 content type, body on stdin.
api() {
    curl -sS --fail-with-body --max-time 30 --cacert "$RUN/pki/ca.crt" --cert "$RUN/pki/admin.crt" \
        --key "$RUN/pki/admin.key" -X "$1" -H "Content-Type: $3" --data-binary @- \
        "https://127.0.0.1:$API_PORT$2"
}

# Server-side apply of the object on stdin to $1 (its path), as field manager $2.
apply() {
    api PATCH "$1?fieldManager=$2&force=true" application/apply-patch+yaml >/dev/null
}

crd_established() {
    curl -sf --max-time 5 --cacert "$RUN/pki/ca.crt" --cert "$RUN/pki/admin.crt" \
        --key "$RUN/pki/admin.key" \
        "https://127.0.0.1:$API_PORT/apis/apiextensions.k8s.io/v1/customresourcedefinitions/$CRD" |
        tr -d ' \n' | grep -q '"type":"Established","status":"True"'
}

kueue_ready() {
    alive kueue && curl -sf --max-time 2 "http://127.0.0.1:$KUEUE_HEALTH_PORT/readyz" >/dev/null
}

kueue_up() {
    [[ -x $BIN/kueue && -d $OUT/kueue-crds ]] || { log "$BIN/kueue is missing: run tests/cluster/cluster.sh build"; exit 1; }
    apiserver_ready || { log "the control plane is not up: run tests/cluster/cluster.sh up"; exit 1; }
    if alive kueue; then
        log "kueue already running (tests/cluster/cluster.sh down first)"
        exit 1
    fi
    local started=$SECONDS file ca
    rm -rf "$RUN/kueue"
    mkdir -p "$RUN/kueue/certs"
    cert kueue-webhook "/CN=kueue-webhook" "basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature
extendedKeyUsage=serverAuth
subjectAltName=IP:127.0.0.1,DNS:localhost"
    cp "$RUN/pki/kueue-webhook.crt" "$RUN/kueue/certs/tls.crt"
    cp "$RUN/pki/kueue-webhook.key" "$RUN/kueue/certs/tls.key"
    # Fixed in Kueue's main.go when its internal certificate management is off.
    local metrics_certs=/etc/kueue/metrics/certs
    if ! { mkdir -p "$metrics_certs" && cp "$RUN/kueue/certs/tls.crt" "$RUN/kueue/certs/tls.key" "$metrics_certs/"; } 2>/dev/null; then
        log "Kueue reads its metrics certificate from $metrics_certs (tls.crt, tls.key), which this user cannot write: run as root or make it writable"
        exit 1
    fi
    cert kueue "/O=system:masters/CN=kueue" "basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature
extendedKeyUsage=clientAuth"
    kubeconfig "$RUN/kueue.kubeconfig" kueue
    ca=$(base64 -w0 <"$RUN/pki/ca.crt")

    echo '{"apiVersion":"v1","kind":"Namespace","metadata":{"name":"kueue-system"}}' |
        apply /api/v1/namespaces/kueue-system vramguard-cluster
    # The CRDs; those Kueue converts between v1beta1 and v1beta2 (v1beta2 stored) call its
    # webhook (the patches of Kueue's config/components/crd kustomization).
    for file in "$OUT/kueue-crds"/*.yaml; do
        CRD="$(basename "$file" .yaml)"
        CRD="${CRD#kueue.x-k8s.io_}.kueue.x-k8s.io"
        apply "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/$CRD" vramguard-cluster <"$file"
        case $CRD in
        localqueues.* | clusterqueues.* | cohorts.* | workloads.* | multikueueclusters.*)
            printf '{"apiVersion":"apiextensions.k8s.io/v1","kind":"CustomResourceDefinition","metadata":{"name":"%s"},"spec":{"conversion":{"strategy":"Webhook","webhook":{"clientConfig":{"url":"https://127.0.0.1:%s/convert","caBundle":"%s"},"conversionReviewVersions":["v1"]}}}}' \
                "$CRD" "$KUEUE_PORT" "$ca" |
                apply "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/$CRD" vramguard-cluster-conversion
            ;;
        esac
    done
    for file in "$OUT/kueue-crds"/*.yaml; do
        CRD="$(basename "$file" .yaml)"
        CRD="${CRD#kueue.x-k8s.io_}.kueue.x-k8s.io"
        wait_for crd_established 60 /dev/null
    done
    # Kueue suspends a Job labelled with a queue at creation (its mjob.kb.io webhook).
    printf '{"apiVersion":"admissionregistration.k8s.io/v1","kind":"MutatingWebhookConfiguration","metadata":{"name":"vramguard-test-kueue"},"webhooks":[{"name":"mjob.kb.io","admissionReviewVersions":["v1"],"clientConfig":{"url":"https://127.0.0.1:%s/mutate-batch-v1-job","caBundle":"%s"},"failurePolicy":"Fail","sideEffects":"None","objectSelector":{"matchExpressions":[{"key":"kueue.x-k8s.io/queue-name","operator":"Exists"}]},"rules":[{"apiGroups":["batch"],"apiVersions":["v1"],"operations":["CREATE"],"resources":["jobs"]}]}]}' \
        "$KUEUE_PORT" "$ca" |
        apply /apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/vramguard-test-kueue vramguard-cluster

    cat >"$RUN/kueue/config.yaml" <<CONFIG
apiVersion: config.kueue.x-k8s.io/v1beta2
kind: Configuration
namespace: kueue-system
manageJobsWithoutQueueName: false
health:
  healthProbeBindAddress: 127.0.0.1:$KUEUE_HEALTH_PORT
metrics:
  bindAddress: 127.0.0.1:$KUEUE_METRICS_PORT
webhook:
  host: 127.0.0.1
  port: $KUEUE_PORT
  certDir: $RUN/kueue/certs
leaderElection:
  leaderElect: false
internalCertManagement:
  enable: false
integrations:
  frameworks:
  - batch/job
CONFIG
    KUBECONFIG="$RUN/kueue.kubeconfig" "$BIN/kueue" --config "$RUN/kueue/config.yaml" \
        --feature-gates VisibilityOnDemand=false >"$RUN/kueue.log" 2>&1 &
    echo $! >"$RUN/kueue.pid"
    wait_for kueue_ready 120 "$RUN/kueue.log"
    log "kueue $KUEUE_VERSION up in $((SECONDS - started))s (log: $RUN/kueue.log)"
}

down() {
    local c pid
    for c in kueue kube-controller-manager kube-apiserver etcd; do
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
    if [[ -f $RUN/kueue.pid ]]; then
        if kueue_ready; then echo "kueue: ready ($(cat "$RUN/kueue.pid"))"; else echo "kueue: not ready"; rc=1; fi
    fi
    return $rc
}

case "${1:-}" in
build) build ;;
up) up ;;
kueue-up) kueue_up ;;
down) down ;;
status) status ;;
*)
    echo "usage: tests/cluster/cluster.sh build|up|kueue-up|down|status" >&2
    exit 2
    ;;
esac
