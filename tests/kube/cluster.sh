#!/bin/sh
# A real single-node Kubernetes v1.35.4 on this machine, for the tests (#43;
# docs/testing.md, "A real cluster"): etcd, kube-apiserver,
# kube-controller-manager, kube-scheduler, kube-proxy and kubelet as built by
# `make kube-tools`, Debian's containerd 1.6 with runc and the CNI bridge.
#
# Usage: cluster.sh up DIR IMAGES...  |  restart-kubelet DIR  |  down DIR
#   up    makes DIR (it must not exist), starts everything in it, imports
#         each OCI archive IMAGES into containerd (the pause image among
#         them: nothing can be pulled here) and waits until the node is Ready;
#         DIR/admin.kubeconfig is then the cluster's. On any failure it
#         prints the logs' tails, tears everything down and exits 1.
#   restart-kubelet  stops kubelet (SIGTERM, as systemd restarts it) and
#         starts it again with up's settings, its pods' containers and
#         volumes left as they are, and waits until the node is Ready.
#   down  ends every process up started, removes every pod's sandbox (CNI
#         teardown, network namespace), every mount under DIR, the
#         interfaces, kube-proxy's iptables chains, the cgroups kubelet made,
#         what containerd and the CNI plugins keep outside DIR, and DIR.
# KUBE_BIN names the programs' directory; KUBELET_ROOT kubelet's root
# directory (DIR/kubelet by default; a chart takes it as node.kubeletPath);
# NODE_TAINTS the taints kubelet registers the node with (KEY=VALUE:EFFECT,
# ..., as node groups give theirs); NODE_STATUS_UPDATE_FREQUENCY how often
# kubelet looks at its Node's status (kubelet's default, 10s, unless given):
# kubelet mounts a new volume only once its Node's status.volumesInUse
# names it, so each new volume's pod waits for that tick (docs/performance.md,
# P9). There is no cloud controller manager:
# a test that needs the node's providerID and cloud labels sets them as the
# AWS one would.
#
# Its world: the machine's cgroups are v1 (kubelet 1.35 starts on them only
# with failCgroupV1: false), there is no systemd (everything runs as this
# shell's children), no registry and no route out (the node, its API server
# and etcd listen on an address of their own on the loopback interface; pods reach the API server's
# Service through kube-proxy's DNAT, no masquerade), and one cluster runs at
# a time (the names below are fixed). /dev is made a shared mount, as
# systemd makes it on a real node (a pod's HostToContainer mount of /dev
# needs it), and made private again by down when up found it so.
set -eu

NODE_IP=10.231.0.1
POD_CIDR=10.232.0.0/24
SERVICE_CIDR=10.233.0.0/24
SERVICE_IP=10.233.0.1
BRIDGE=ebs-cni0
NODE_NAME=${NODE_NAME:-ebs-csi-node}
# What containerd 1.6 and the CNI plugins keep at fixed places: removed by
# down when up found them absent.
OUTSIDE="/run/containerd /var/lib/cni /var/log/containers /run/netns"

command=$1 dir=$2
shift 2
bin=${KUBE_BIN:?KUBE_BIN names the built programs (make kube-tools)}
sock=$dir/containerd/containerd.sock

# start NAME PROGRAM ARGS...: a child in its own session, its log (appended
# to: a restarted kubelet's follows the first's) and pid in DIR.
start() {
    name=$1
    shift
    setsid "$@" >>"$dir/logs/$name.log" 2>&1 </dev/null &
    echo $! >"$dir/pids/$name"
}

# wait_for WHAT SECONDS COMMAND...: until COMMAND succeeds.
wait_for() {
    what=$1 left=$2
    shift 2
    until "$@" >/dev/null 2>&1; do
        left=$((left - 1))
        [ "$left" -gt 0 ] || { echo "cluster.sh: $what: not within its time" >&2; return 1; }
        sleep 1
    done
}

kubectl() { "$bin/kubectl" --kubeconfig "$dir/admin.kubeconfig" "$@"; }
crictl() { "$bin/crictl" --runtime-endpoint "unix://$sock" --timeout 60s "$@"; }

# kubeconfig FILE USER: the API server with USER's token.
kubeconfig() {
    cat >"$1" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: test
  cluster: {server: "https://$NODE_IP:6443", certificate-authority: "$dir/pki/ca.crt"}
users:
- name: $2
  user: {token: "$(grep ",$2," "$dir/pki/tokens.csv" | cut -d, -f1)"}
contexts:
- name: test
  context: {cluster: test, user: $2}
current-context: test
EOF
}

pki() {
    p=$dir/pki
    mkdir -p "$p"
    openssl req -x509 -newkey rsa:2048 -nodes -keyout "$p/ca.key" -out "$p/ca.crt" -days 2 \
        -subj /CN=ebs-csi-test-ca 2>/dev/null
    printf 'subjectAltName=IP:%s,IP:%s,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local\n' \
        "$NODE_IP" "$SERVICE_IP" >"$p/apiserver.ext"
    openssl req -newkey rsa:2048 -nodes -keyout "$p/apiserver.key" -out "$p/apiserver.csr" \
        -subj /CN=kube-apiserver 2>/dev/null
    openssl x509 -req -in "$p/apiserver.csr" -CA "$p/ca.crt" -CAkey "$p/ca.key" -CAcreateserial \
        -out "$p/apiserver.crt" -days 2 -extfile "$p/apiserver.ext" 2>/dev/null
    openssl genrsa -out "$p/sa.key" 2048 2>/dev/null
    openssl rsa -in "$p/sa.key" -pubout -out "$p/sa.pub" 2>/dev/null
    # token,user,uid,groups: the components as system:masters, kubelet as the
    # node it is (the Node authorizer and NodeRestriction apply to it).
    for user in admin kube-controller-manager kube-scheduler kube-proxy; do
        echo "$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n'),$user,$user,system:masters"
    done >"$p/tokens.csv"
    echo "$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n'),system:node:$NODE_NAME,$NODE_NAME,system:nodes" >>"$p/tokens.csv"
    for user in admin kube-controller-manager kube-scheduler kube-proxy "system:node:$NODE_NAME"; do
        kubeconfig "$dir/${user#system:node:}.kubeconfig" "$user"
    done
    mv "$dir/$NODE_NAME.kubeconfig" "$dir/kubelet.kubeconfig"
}

network() {
    ip addr add "$NODE_IP/32" dev lo
    mkdir -p "$dir/cni/conf" "$dir/cni/ipam"
    cat >"$dir/cni/conf/10-ebs-csi-test.conflist" <<EOF
{"cniVersion": "0.4.0", "name": "ebs-csi-test", "plugins": [
  {"type": "bridge", "bridge": "$BRIDGE", "isGateway": true, "ipMasq": false, "hairpinMode": true,
   "ipam": {"type": "host-local", "ranges": [[{"subnet": "$POD_CIDR"}]],
            "routes": [{"dst": "0.0.0.0/0"}], "dataDir": "$dir/cni/ipam"}},
  {"type": "portmap", "capabilities": {"portMappings": true}}]}
EOF
}

containerd_config() {
    c=$dir/containerd
    mkdir -p "$c"
    cat >"$c/config.toml" <<EOF
version = 2
root = "$c/root"
state = "$c/state"
[grpc]
  address = "$sock"
[plugins."io.containerd.internal.v1.opt"]
  path = "$c/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "registry.k8s.io/pause:3.10.1"
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$dir/cni/conf"
EOF
}

kubelet_config() {
    cat >"$dir/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $NODE_IP
healthzBindAddress: $NODE_IP
readOnlyPort: 0
authentication: {anonymous: {enabled: true}, webhook: {enabled: false}}
authorization: {mode: AlwaysAllow}
cgroupDriver: cgroupfs
failCgroupV1: false
failSwapOn: false
containerRuntimeEndpoint: unix://$sock
podLogsDir: $dir/pod-logs
evictionHard: {memory.available: 100Mi, nodefs.available: 1%, imagefs.available: 1%}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
syncFrequency: 10s
EOF
    # Given, it is set with kubelet's default report frequency (5m: a
    # status unchanged is not written more often), which an explicit
    # update frequency would otherwise become too.
    if [ -n "${NODE_STATUS_UPDATE_FREQUENCY:-}" ]; then
        printf 'nodeStatusUpdateFrequency: %s\nnodeStatusReportFrequency: 5m\n' \
            "$NODE_STATUS_UPDATE_FREQUENCY" >>"$dir/kubelet.yaml"
    fi
}

up() {
    [ ! -e "$dir" ] || { echo "cluster.sh: $dir exists" >&2; exit 1; }
    if ip -brief address show dev lo | grep -q " $NODE_IP/"; then
        echo "cluster.sh: another cluster runs on this machine ($NODE_IP is on lo)" >&2
        exit 1
    fi
    mkdir -p "$dir/logs" "$dir/pids" "$dir/pod-logs" "${KUBELET_ROOT:=$dir/kubelet}"
    for path in $OUTSIDE; do [ -e "$path" ] || echo "$path"; done >"$dir/outside"
    trap 'failed' EXIT
    pki
    network
    if [ "$(findmnt -no PROPAGATION /dev)" = private ]; then
        mount --make-shared /dev
        touch "$dir/dev-was-private"
    fi
    start etcd "$bin/etcd" --name test --data-dir "$dir/etcd" \
        --listen-client-urls "http://$NODE_IP:2379" --advertise-client-urls "http://$NODE_IP:2379" \
        --listen-peer-urls "http://$NODE_IP:2380" --initial-advertise-peer-urls "http://$NODE_IP:2380" \
        --initial-cluster "test=http://$NODE_IP:2380" --listen-metrics-urls "http://$NODE_IP:2381"
    start kube-apiserver "$bin/kube-apiserver" --etcd-servers "http://$NODE_IP:2379" \
        --bind-address "$NODE_IP" --advertise-address "$NODE_IP" --secure-port 6443 \
        --tls-cert-file "$dir/pki/apiserver.crt" --tls-private-key-file "$dir/pki/apiserver.key" \
        --client-ca-file "$dir/pki/ca.crt" --token-auth-file "$dir/pki/tokens.csv" \
        --authorization-mode Node,RBAC --enable-admission-plugins NodeRestriction \
        --service-cluster-ip-range "$SERVICE_CIDR" --allow-privileged --kubelet-preferred-address-types InternalIP \
        --service-account-issuer https://kubernetes.default.svc \
        --service-account-key-file "$dir/pki/sa.pub" --service-account-signing-key-file "$dir/pki/sa.key"
    wait_for "the API server" 120 kubectl get --raw /readyz
    start kube-controller-manager "$bin/kube-controller-manager" \
        --kubeconfig "$dir/kube-controller-manager.kubeconfig" --leader-elect=false \
        --bind-address "$NODE_IP" --service-account-private-key-file "$dir/pki/sa.key" \
        --root-ca-file "$dir/pki/ca.crt" --service-cluster-ip-range "$SERVICE_CIDR"
    start kube-scheduler "$bin/kube-scheduler" --kubeconfig "$dir/kube-scheduler.kubeconfig" \
        --leader-elect=false --bind-address "$NODE_IP"
    containerd_config
    start containerd containerd --config "$dir/containerd/config.toml"
    wait_for containerd 60 crictl info
    for image in "$@"; do
        ctr --address "$sock" --namespace k8s.io images import "$image" >/dev/null
    done
    start kube-proxy "$bin/kube-proxy" --kubeconfig "$dir/kube-proxy.kubeconfig" \
        --hostname-override "$NODE_NAME" --proxy-mode iptables --cluster-cidr "$POD_CIDR" \
        --bind-address "$NODE_IP" --healthz-bind-address "$NODE_IP:10256" \
        --metrics-bind-address "$NODE_IP:10249" --conntrack-max-per-core 0 \
        --conntrack-tcp-timeout-established 0 --conntrack-tcp-timeout-close-wait 0
    kubelet_config
    printf 'KUBELET_ROOT=%s\nNODE_TAINTS=%s\n' "$KUBELET_ROOT" "${NODE_TAINTS:-}" >"$dir/kubelet.env"
    start_kubelet
    trap - EXIT
}

# start_kubelet: kubelet with up's settings (DIR/kubelet.env), until it
# serves (its healthz through the API server: a restarted kubelet's node
# is still Ready from before) and the node is Ready.
start_kubelet() {
    . "$dir/kubelet.env"
    start kubelet "$bin/kubelet" --config "$dir/kubelet.yaml" --kubeconfig "$dir/kubelet.kubeconfig" \
        --root-dir "$KUBELET_ROOT" --hostname-override "$NODE_NAME" --node-ip "$NODE_IP" \
        --register-with-taints "$NODE_TAINTS"
    wait_for "kubelet serving" 120 kubectl get --raw "/api/v1/nodes/$NODE_NAME/proxy/healthz"
    wait_for "node $NODE_NAME Ready" 120 kubectl wait --for condition=Ready --timeout 1s "node/$NODE_NAME"
}

failed() {
    for log in "$dir"/logs/*.log; do
        echo "--- $log" >&2
        tail -n 20 "$log" >&2
    done
    down
    exit 1
}

# stop NAME: SIGTERM, then SIGKILL after 10 s, and reaped.
stop() {
    [ -f "$dir/pids/$1" ] || return 0
    pid=$(cat "$dir/pids/$1")
    kill "$pid" 2>/dev/null
    for _ in 1 2 3 4 5 6 7 8 9 10; do
        kill -0 "$pid" 2>/dev/null || break
        sleep 1
    done
    kill -9 "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
    rm -f "$dir/pids/$1"
}

# kube_chains_removed IPTABLES: the KUBE-* chains kubelet makes (the canary,
# the firewall; kube-proxy --cleanup takes only its own) and every rule
# that jumps to one.
kube_chains_removed() {
    "$1-save" | awk '
        /^\*/ { table = substr($0, 2) }
        /^-A / && $2 !~ /^KUBE-/ && / -j KUBE-/ { sub(/^-A /, ""); print table, "-D", $0 }
        /^:KUBE-/ { chains = chains " " table " " substr($1, 2) }
        END {
            n = split(chains, c, " ")
            for (i = 1; i < n; i += 2) print c[i], "-F", c[i + 1]
            for (i = 1; i < n; i += 2) print c[i], "-X", c[i + 1]
        }
    ' | while read -r table rule; do
        eval "$1 -w -t $table $rule"
    done
}

# Every step is tried whatever the one before it did.
down() {
    [ -d "$dir" ] || return 0
    set +e
    stop kubelet
    [ -S "$sock" ] && crictl rmp --all --force >/dev/null 2>&1
    stop containerd
    # The shims of containers crictl could not remove, and their processes.
    for pid in $(pgrep -f "containerd-shim-runc-v2 .*-address $sock" || true); do
        kill -9 -- "-$pid" "$pid" 2>/dev/null
    done
    stop kube-proxy
    "$bin/kube-proxy" --cleanup >/dev/null 2>&1
    kube_chains_removed iptables
    kube_chains_removed ip6tables
    for name in kube-scheduler kube-controller-manager kube-apiserver etcd; do stop "$name"; done
    # Deepest first, each mount under DIR and the network namespaces' files.
    for point in $(awk -v d="$dir/" 'index($5, d) == 1 { print $5 }' /proc/self/mountinfo | sort -r); do
        umount -l "$point" 2>/dev/null
    done
    # A container's processes outlive a shim killed above (they are not in
    # its process group), and one being stopped may not have exited yet: a
    # pod's cgroup is removed only once empty, so every process left in
    # the pods' cgroups is ended and waited for (up to 5 s) first.
    for hierarchy in /sys/fs/cgroup/*/; do
        [ -d "${hierarchy}kubepods" ] || continue
        for _ in $(seq 50); do
            pids=$(find "${hierarchy}kubepods" -name cgroup.procs -exec cat {} + 2>/dev/null)
            [ -z "$pids" ] && break
            kill -9 $pids 2>/dev/null
            sleep 0.1
        done
        find "${hierarchy}kubepods" -depth -type d -exec rmdir {} + 2>/dev/null
    done
    [ -f "$dir/dev-was-private" ] && mount --make-private /dev
    ip addr del "$NODE_IP/32" dev lo 2>/dev/null
    ip link del "$BRIDGE" 2>/dev/null
    find /var/log/containers -lname "$dir/*" -delete 2>/dev/null
    [ -f "$dir/outside" ] && while read -r path; do rm -rf "$path"; done <"$dir/outside"
    rm -rf "$dir"
}

case $command in
up) up "$@" ;;
restart-kubelet) stop kubelet && start_kubelet ;;
down) down ;;
*) echo "usage: cluster.sh up DIR IMAGES... | restart-kubelet DIR | down DIR" >&2; exit 2 ;;
esac
