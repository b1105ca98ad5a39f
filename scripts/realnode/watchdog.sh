#!/usr/bin/env bash
# watchdog.sh OWNER_PID DIR: started by up.sh --owner-pid; runs down.sh DIR as soon as
# OWNER_PID is gone (a test killed by Ctrl-C, a timeout or SIGKILL), or when DIR's node
# was already torn down (then it just exits).
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
owner=$1 dir=$2
while kill -0 "$owner" 2>/dev/null; do
	[ -f "$dir/env" ] || exit 0
	sleep 1
done
[ -f "$dir/env" ] || exit 0
echo "owner $owner gone; tearing down $dir"
exec "$HERE/down.sh" "$dir"
