# Names and fixed ids of the accounts an hpcvm site uses, sourced by
# scripts/install-node.sh (the node install) and scripts/test-cluster.sh (its test user
# joins the same group). Fixed ids, the same on every node: files a VM or a job writes on
# a shared file system then belong to the same account everywhere. An admin chooses them
# by setting the variables before running install-node.sh (on every node alike).
# shellcheck shell=bash

# The group whose members may use the node's grants (bridge helper ACL, hugetlbfs mount).
: "${HPCVM_GROUP:=hpcvm}"
: "${HPCVM_GID:=2300}"
# The unprivileged account QEMU drops to when hpcvm itself runs as root (-runas).
: "${HPCVM_QEMU_USER:=hpcvm-qemu}"
: "${HPCVM_QEMU_UID:=2301}"
: "${HPCVM_QEMU_GID:=2301}"
