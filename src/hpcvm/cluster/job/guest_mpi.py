"""How MPI ranks start in every VM of a job: sshd in each guest, with a per-job key.

Why sshd: Open MPI 4.1's launcher for hosts outside a batch system is ``plm rsh``,
which starts its daemon (``orted``) on every host through ``ssh``; every MPI user knows
that path and every Open MPI version supports it. The alternatives were worse here:
Slurm inside the guests duplicates the host's Slurm; PMIx daemons started through the
guest agent would make hpcvm a launcher of its own. The guests run the host's
``/usr/sbin/sshd`` (the built-in guest shares ``/usr``) with a key pair made for this
job only: the public key goes to every guest, the private key only to the first VM,
where ``cluster exec`` runs ``mpirun``. Tree spawn is off, so no other guest ever needs
the private key. Each guest gets its own host key, made by its node's task on the host
and handed to the guest with the job's public key (the guest agent's stdin; it is never
written to the host's disk beyond a private temporary directory removed at once): made
in a guest just booted under TCG, ``ssh-keygen`` took 1.6 s of the 1.7 s its sshd took
to start (benchmarks/cluster_up.py's breakdown), made natively it takes milliseconds.

The guest's ``/etc/shadow`` is hidden from it (the host's secrets stay on the host), and
sshd refuses an account whose password entry it cannot read ("account is locked"), so
the guest writes its own one-line ``/etc/shadow`` (root, no password: key only) into its
private overlay. Nothing of it reaches the host.

A disk-image guest (``cluster up --image``, the guests a job checkpoints) runs its own
image's ``sshd``, ``ssh`` and Open MPI instead, keeps its own ``/etc/shadow``, and
gives itself the job's address first (:func:`address_script`): only the built-in guest
configures its network at boot. Everything the scripts write in a guest is in its
``/run`` (tmpfs), so a checkpoint keeps it and nothing reaches the image.
"""

from __future__ import annotations

import ipaddress
import shlex
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from hpcvm.errors import RuntimeFailure
from hpcvm.runtime.machine.timeouts import PROMPT_POLL

if TYPE_CHECKING:  # cluster exec reads mpi_environment without the models (job/view.py)
    from hpcvm.runtime.machine.model import Machine

GUEST_DIR = "/run/hpcvm-cluster"  # the guest's tmpfs: gone with the VM
AUTHORIZED_KEYS = f"{GUEST_DIR}/authorized_keys"
PRIVATE_KEY = f"{GUEST_DIR}/id_job"
HOSTFILE = f"{GUEST_DIR}/hostfile"
SSHD = "/usr/sbin/sshd"
SSH_PACKAGES = "openssh-server openssh-client"
GUEST_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

_SSH_OPTIONS = (
    "-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR -o BatchMode=yes"
)


def sshd_stdin(public_key: str, host_key: str) -> str:
    """What :func:`sshd_script` reads: the job's public key on one line, then the
    guest's private host key."""
    return public_key.strip() + "\n" + host_key


def keygen(path: Path, comment: str) -> None:
    """An ed25519 key pair without passphrase at ``path`` (and ``path``.pub)."""
    done = subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
        capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeFailure(f"ssh-keygen failed: {done.stderr.strip()}")


def host_key(name: str) -> str:
    """A fresh ed25519 host key for guest ``name`` (module doc), made natively."""
    with tempfile.TemporaryDirectory(prefix="hpcvm-hostkey-") as tmp:
        path = Path(tmp) / "host_key"
        keygen(path, name)
        return path.read_text()


def sshd_script(hostname: str, address: ipaddress.IPv4Interface) -> str:
    """Shell run in a guest (:func:`sshd_stdin` on stdin): name the guest (Open MPI
    tells hosts apart by name), accept the job's key, start sshd with its host key on
    the VM network's address only."""
    d = GUEST_DIR
    return f"""set -e
umask 077
hostname {shlex.quote(hostname)}
mkdir -p {d} /run/sshd
IFS= read -r key
printf '%s\\n' "$key" > {AUTHORIZED_KEYS}
cat > {d}/host_key
[ -s /etc/shadow ] || echo 'root:*:1::::::' > /etc/shadow
cat > {d}/sshd_config <<'EOF'
HostKey {d}/host_key
AuthorizedKeysFile {AUTHORIZED_KEYS}
ListenAddress {address.ip}
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
PidFile {d}/sshd.pid
EOF
{SSHD} -f {d}/sshd_config -E {d}/sshd.log
"""


ADDRESS_TAKEN_EXIT = 3  # address_script's exit code when the segment answers for it


def address_script(mac: str, address: ipaddress.IPv4Interface) -> str:
    """Shell run in a disk-image guest before :func:`sshd_script`: give the NIC with
    ``mac`` the job's ``address``, after asking the segment whether anyone answers for
    it (RFC 5227's probe, ``arping -D``, when the image has it; exit
    ``ADDRESS_TAKEN_EXIT`` if someone does), and stop the image's own sshd if it runs
    (the job's listens on the same port)."""
    ip = address.ip
    return f"""set -e
dev=
for f in /sys/class/net/*/address; do
    [ "$(cat "$f")" = {shlex.quote(mac)} ] && dev=$(basename "$(dirname "$f")")
done
[ -n "$dev" ] || {{ echo "no network interface with MAC {mac} in the guest" >&2; exit 1; }}
ip link set "$dev" up
if ! ip -4 -o addr show dev "$dev" | grep -q " {ip}/"; then
    if command -v arping >/dev/null && ! arping -D -q -c 2 -w 3 -I "$dev" {ip}; then
        echo "address {ip} is in use on the segment already" >&2
        exit {ADDRESS_TAKEN_EXIT}
    fi
    ip addr add {address} dev "$dev"
fi
systemctl stop ssh.service ssh.socket 2>/dev/null || true
"""


def first_vm_script(hosts: Sequence[tuple[str, int]]) -> str:
    """Shell run in the first VM (the private key on stdin): the key and the hostfile
    of every VM's address with its vCPU count as slots."""
    lines = "\n".join(f"{address} slots={slots}" for address, slots in hosts)
    return f"""set -e
umask 077
mkdir -p {GUEST_DIR}
cat > {PRIVATE_KEY}
cat > {HOSTFILE} <<'EOF'
{lines}
EOF
"""


def mpi_environment(network: ipaddress.IPv4Network) -> list[str]:
    """The environment ``cluster exec`` gives its command in the first VM: a plain
    ``mpirun -np N ./app`` then starts ranks on every VM of the job, over the VM
    network (TCP between VMs, shared memory within one), as root (the guest is the
    job's own machine)."""
    subnet = str(network)
    return [
        f"PATH={GUEST_PATH}",
        "HOME=/root",
        f"OMPI_MCA_plm_rsh_agent=ssh -i {PRIVATE_KEY} {_SSH_OPTIONS}",
        "OMPI_MCA_plm_rsh_no_tree_spawn=1",
        f"OMPI_MCA_orte_default_hostfile={HOSTFILE}",
        f"OMPI_MCA_btl_tcp_if_include={subnet}",
        f"OMPI_MCA_oob_tcp_if_include={subnet}",
        "OMPI_MCA_pml=ob1",
        "OMPI_MCA_btl=self,vader,tcp",
        "OMPI_ALLOW_RUN_AS_ROOT=1",
        "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1",
    ]


def script_shell(machine: Machine) -> list[str]:
    """The shell for a script in ``machine``'s guest: the built-in guest's static
    busybox, else the image's ``/bin/sh``.

    Why: busybox's sh runs ``cat``, ``mkdir``, ``hostname`` as its own applets (a fork
    at most), where dash forks and execs a dynamically linked program for each, some
    150 ms apiece under TCG; the sshd script took 1.0-1.1 s under dash and 0.6-0.7 s
    under busybox in the same guest (docs/performance.md)."""
    if machine.boot.disk_image is None:
        from hpcvm.guest.scripts import GUEST_BUSYBOX

        return [GUEST_BUSYBOX, "sh", "-c"]
    return ["/bin/sh", "-c"]


def run_script(
    machine: Machine,
    script: str,
    stdin: str,
    what: str,
    timeout: float = 60,
    causes: dict[int, str] | None = None,
) -> None:
    """Run ``script`` with :func:`script_shell` in the guest, ``stdin`` fed to it;
    RuntimeFailure with the guest's own error text when it fails (its ``cause`` from
    ``causes`` by exit code)."""
    from hpcvm.runtime.vm.guest_exec import exec_in

    done = exec_in(
        machine,
        [*script_shell(machine), script],
        timeout,
        input=stdin.encode(),
        env=[f"PATH={GUEST_PATH}"],
        poll_max=PROMPT_POLL,  # cluster up waits for it
    )
    if done.exit_code != 0:
        text = done.stderr.strip() or done.stdout.strip() or f"exit code {done.exit_code}"
        raise RuntimeFailure(
            f"{what} failed in VM {machine.name}: {text.splitlines()[-1]}",
            cause=(causes or {}).get(done.exit_code),
        )


def require_sshd() -> None:
    """The guests run the host's sshd: refuse before anything starts when it is missing."""
    if not Path(SSHD).is_file():
        raise RuntimeFailure(
            f"{SSHD} not found: the guests start MPI ranks over ssh; install {SSH_PACKAGES}"
        )
