#!/bin/sh
# node-up.sh runs INSIDE the cgroup v2 VM (test/e2e/nodev2 copies it onto the payload
# disk, /opt/understory) and makes the guest a Kubernetes node as production runs one:
#   - containerd (config v3) with runc's systemd cgroup driver (SystemdCgroup = true)
#     and NRI on at its default socket, as a systemd service with Delegate=yes;
#   - kubelet v1.37.2 as a systemd service with cgroupDriver: systemd and everything else
#     at its defaults (no failCgroupV1, swap, eviction or authentication changes) but
#     what any kubeadm node sets: the runtime endpoint, the client CA, the kubeconfig
#     and --node-ip;
#   - kube-proxy (iptables) as a systemd service, and a bridge pod network (Debian's CNI
#     plugins, pods masqueraded behind the node's address).
# Its inputs are the payload's node.env (API_URL, NODE_NAME, NODE_IP, NODE_PREFIX,
# GUEST_POD_CIDR, SERVICE_CIDR, PAUSE_IMAGE), pki/ (ca.crt, node.crt/.key,
# kube-proxy.crt/.key), bin/ (kubelet, kube-proxy, containerd, containerd-shim-runc-v2,
# ctr, runc) and images/*.tar (imported into containerd's k8s.io namespace).
# It returns once containerd serves and kubelet and kube-proxy are started; the test
# waits for the node to be Ready through the API server.
set -eu
P=/opt/understory
. "$P/node.env"

ip link set lo up
ip addr add "$NODE_IP/$NODE_PREFIX" dev eth0
ip link set eth0 up
# Services (kube-proxy DNATs them) leave through the link to the host, which serves
# the API; there is no default route: nothing beyond the host is reachable.
ip route add "$SERVICE_CIDR" dev eth0
sysctl -qw net.ipv4.ip_forward=1 net.bridge.bridge-nf-call-iptables=1

install -m 0755 "$P"/bin/* /usr/local/bin/

mkdir -p /etc/containerd /etc/cni/net.d /etc/kubernetes/pki /var/lib/kubelet /var/lib/kube-proxy
cp "$P"/pki/* /etc/kubernetes/pki/

cat >/etc/containerd/config.toml <<EOF
version = 3
[plugins."io.containerd.nri.v1.nri"]
  disable = false
[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = "$PAUSE_IMAGE"
[plugins."io.containerd.cri.v1.runtime"]
  enable_cdi = false
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = ["/usr/lib/cni"]
    conf_dir = "/etc/cni/net.d"
  [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
      BinaryName = "/usr/local/bin/runc"
      SystemdCgroup = true
EOF
# containerd's own unit file (containerd.service upstream), trimmed to what matters.
cat >/etc/systemd/system/containerd.service <<'EOF'
[Unit]
Description=containerd container runtime
After=network.target local-fs.target dbus.service
[Service]
ExecStartPre=-/sbin/modprobe overlay
ExecStart=/usr/local/bin/containerd
Type=notify
Delegate=yes
KillMode=process
Restart=always
RestartSec=2
LimitNPROC=infinity
LimitCORE=infinity
TasksMax=infinity
OOMScoreAdjust=-999
[Install]
WantedBy=multi-user.target
EOF

cat >/etc/cni/net.d/10-understory.conflist <<EOF
{"cniVersion": "1.0.0", "name": "understory-v2", "plugins": [{
  "type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": true, "hairpinMode": true,
  "ipam": {"type": "host-local", "routes": [{"dst": "0.0.0.0/0"}],
           "ranges": [[{"subnet": "$GUEST_POD_CIDR"}]]}
}]}
EOF

kubeconfig() { # NAME CERT KEY
	cat <<EOF
apiVersion: v1
kind: Config
clusters:
- name: understory
  cluster: {server: "$API_URL", certificate-authority: /etc/kubernetes/pki/ca.crt}
users:
- name: $1
  user: {client-certificate: /etc/kubernetes/pki/$2, client-key: /etc/kubernetes/pki/$3}
contexts:
- name: understory
  context: {cluster: understory, user: $1}
current-context: understory
EOF
}
kubeconfig "system:node:$NODE_NAME" node.crt node.key >/etc/kubernetes/kubelet.conf
kubeconfig system:kube-proxy kube-proxy.crt kube-proxy.key >/etc/kubernetes/kube-proxy.conf

# kubelet's configuration: the systemd driver, and otherwise what kubeadm writes.
cat >/var/lib/kubelet/config.yaml <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
cgroupDriver: systemd
containerRuntimeEndpoint: unix:///run/containerd/containerd.sock
authentication:
  x509: {clientCAFile: /etc/kubernetes/pki/ca.crt}
EOF
cat >/etc/systemd/system/kubelet.service <<EOF
[Unit]
Description=kubelet
After=containerd.service
Wants=containerd.service
[Service]
ExecStart=/usr/local/bin/kubelet --config=/var/lib/kubelet/config.yaml --kubeconfig=/etc/kubernetes/kubelet.conf --node-ip=$NODE_IP --hostname-override=$NODE_NAME
Restart=always
RestartSec=2
[Install]
WantedBy=multi-user.target
EOF

cat >/var/lib/kube-proxy/config.yaml <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: /etc/kubernetes/kube-proxy.conf}
hostnameOverride: $NODE_NAME
mode: iptables
clusterCIDR: $GUEST_POD_CIDR
EOF
cat >/etc/systemd/system/kube-proxy.service <<'EOF'
[Unit]
Description=kube-proxy
After=network.target
[Service]
ExecStart=/usr/local/bin/kube-proxy --config=/var/lib/kube-proxy/config.yaml
Restart=always
RestartSec=2
[Install]
WantedBy=multi-user.target
EOF

systemctl daemon-reload
systemctl start containerd
i=0
until ctr version >/dev/null 2>&1; do
	i=$((i + 1))
	[ $i -lt 300 ] || { echo "containerd did not serve within 60 s" >&2; journalctl -u containerd --no-pager | tail -n 30 >&2; exit 1; }
	sleep 0.2
done
for t in "$P"/images/*.tar; do
	ctr -n k8s.io images import --snapshotter overlayfs "$t" >/dev/null
done
systemctl start kubelet kube-proxy
echo "node-up: containerd serving, images imported, kubelet and kube-proxy started"
