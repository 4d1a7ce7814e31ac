#!/usr/bin/env bash
# Install the Debian packages orch's tests and demo need, only those that are missing.
# openssh-server: each test host runs its own sshd; iproute2: `ip netns` test hosts;
# nftables: fault injection between test hosts (dropped ports).
set -euo pipefail
need=()
command -v /usr/sbin/sshd >/dev/null 2>&1 || need+=(openssh-server)
command -v ip >/dev/null 2>&1 || need+=(iproute2)
command -v nft >/dev/null 2>&1 || need+=(nftables)
command -v ssh-keygen >/dev/null 2>&1 || need+=(openssh-client)
[ ${#need[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -eq 0 ]; then sudo=(); else sudo=(sudo); fi
echo "installing Debian packages: ${need[*]}"
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get update -q >/dev/null
"${sudo[@]}" apt-get install -y -q "${need[@]}" >/dev/null
