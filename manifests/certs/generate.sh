#!/usr/bin/env bash
# generate.sh writes the certificates of a self-signed Understory install (no
# cert-manager), for `kubectl apply -k manifests/` (manifests/certs is the kustomize
# component that turns them into Secrets and the webhook's caBundle).
#
#   manifests/certs/generate.sh            # once; keeps what exists
#   manifests/certs/generate.sh --renew    # new serving/client certificates, same CA
#   manifests/certs/generate.sh --force    # everything new, a new CA included
#
# Options: -d DIR (default: generated/ next to this script), --days N (validity of
# the serving and client certificates, default 365; the CA: 3650). The names are
# those of the Services in understory-system, which the manifests name literally.
#
# Files (PEM; keys mode 0600):
#   ca.crt, ca.key                        the CA. ca.crt goes to kube-scheduler
#                                         (tlsConfig.caFile) and Prometheus;
#                                         keep ca.key safe, --renew needs it
#   admission.crt, admission.key          the webhook, understory-admission.understory-system.svc
#   scheduler-extender.crt, .key          the extender, understory-scheduler-extender.understory-system.svc
#   scheduler-client.crt, .key            kube-scheduler's client certificate for
#                                         the extender (tlsConfig certFile/keyFile);
#                                         also the Secret understory-scheduler-client-tls
#                                         the second scheduler mounts
#
# After --renew or --force: `kubectl apply -k manifests/` again (the webhook and
# the extender re-read their Secrets without a restart), and copy ca.crt and the
# scheduler-client pair to the control-plane hosts again (kube-scheduler reads
# them at start: restart it), or, with the second scheduler, restart it in the
# cluster (kubectl -n understory-system rollout restart deployment/understory-scheduler).
# Needs openssl (1.1.1 or newer).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
dir=$here/generated
days=365
ca_days=3650
ns=understory-system
mode=keep

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; }
die() { echo "generate.sh: $*" >&2; exit 1; }

while [ $# -gt 0 ]; do
	case $1 in
	-d) [ $# -ge 2 ] || die "-d needs a directory"; dir=$2; shift 2 ;;
	--days) [ $# -ge 2 ] || die "--days needs a number"; days=$2; shift 2 ;;
	--renew) mode=renew; shift ;;
	--force) mode=force; shift ;;
	-h | --help) usage; exit 0 ;;
	*) usage >&2; die "unknown argument $1" ;;
	esac
done
case $days in '' | *[!0-9]*) die "--days must be a whole number of days, got '$days'" ;; esac
[ "$days" -ge 1 ] || die "--days must be at least 1"
command -v openssl >/dev/null 2>&1 || die "openssl not found: install it (Debian/Ubuntu: apt-get install openssl), or use cert-manager (manifests/components/cert-manager)"

umask 077
mkdir -p "$dir"
tmp=$(mktemp -d "$dir/.tmp.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

if [ "$mode" = force ]; then
	rm -f "$dir"/*.crt "$dir"/*.key
fi
if [ "$mode" = renew ] && [ ! -s "$dir/ca.key" ]; then
	die "--renew needs the CA's key $dir/ca.key; without it, start over with --force (and redistribute ca.crt)"
fi

# Everything is written to $tmp first and moved into place at the end, so an
# interrupted run never leaves a key without its certificate.
if [ -s "$dir/ca.crt" ] && [ -s "$dir/ca.key" ]; then
	cp "$dir/ca.crt" "$dir/ca.key" "$tmp/"
elif [ -e "$dir/ca.crt" ] || [ -e "$dir/ca.key" ]; then
	die "$dir has only half of the CA (ca.crt, ca.key); restore it or start over with --force"
else
	openssl req -x509 -new -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days "$ca_days" \
		-subj "/CN=understory-ca" -addext "basicConstraints=critical,CA:TRUE" \
		-addext "keyUsage=critical,keyCertSign,cRLSign,digitalSignature" \
		-keyout "$tmp/ca.key" -out "$tmp/ca.crt" 2>"$tmp/err" || { cat "$tmp/err" >&2; die "creating the CA failed"; }
	echo "generate.sh: new CA $dir/ca.crt (copy it to kube-scheduler's hosts and Prometheus)" >&2
fi

# issue NAME CN EXTKEYUSAGE [SAN]: a leaf certificate signed by the CA.
issue() {
	local name=$1 cn=$2 eku=$3 san=${4:-}
	if [ "$mode" = keep ] && [ -s "$dir/$name.crt" ] && [ -s "$dir/$name.key" ]; then
		cp "$dir/$name.crt" "$dir/$name.key" "$tmp/"
		return
	fi
	{
		echo "basicConstraints=critical,CA:FALSE"
		echo "keyUsage=critical,digitalSignature"
		echo "extendedKeyUsage=$eku"
		[ -z "$san" ] || echo "subjectAltName=$san"
	} >"$tmp/$name.ext"
	openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=$cn" \
		-keyout "$tmp/$name.key" -out "$tmp/$name.csr" 2>"$tmp/err" || { cat "$tmp/err" >&2; die "key for $name failed"; }
	openssl x509 -req -in "$tmp/$name.csr" -CA "$tmp/ca.crt" -CAkey "$tmp/ca.key" -set_serial "0x$(openssl rand -hex 16)" \
		-days "$days" -sha256 -extfile "$tmp/$name.ext" -out "$tmp/$name.crt" 2>"$tmp/err" ||
		{ cat "$tmp/err" >&2; die "signing $name failed"; }
	openssl verify -CAfile "$tmp/ca.crt" "$tmp/$name.crt" >/dev/null 2>"$tmp/err" ||
		{ cat "$tmp/err" >&2; die "$name does not verify against the CA"; }
	echo "generate.sh: issued $dir/$name.crt ($cn, $days days)" >&2
}

svc() { echo "DNS:$1.$ns.svc,DNS:$1.$ns.svc.cluster.local"; }
issue admission "understory-admission.$ns.svc" serverAuth "$(svc understory-admission)"
issue scheduler-extender "understory-scheduler-extender.$ns.svc" serverAuth "$(svc understory-scheduler-extender)"
issue scheduler-client understory-scheduler-client clientAuth

for f in ca admission scheduler-extender scheduler-client; do
	mv -f "$tmp/$f.key" "$dir/$f.key"
	mv -f "$tmp/$f.crt" "$dir/$f.crt"
	chmod 0644 "$dir/$f.crt"
done
echo "$dir"
