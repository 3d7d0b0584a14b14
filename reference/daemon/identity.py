"""Identity on disk (§2): the host fingerprint, the member keypair and the local IPC token.

host_fingerprint.json = {schema_version: 1, fingerprint: sha256(host_id 0x00 stable_mac) hex, host_id, stable_mac,
written_at}. host_id is "linux:<machine-id>" from /etc/machine-id, then /var/lib/dbus/machine-id, else "". The stable
MAC is the lexically first interface that is not loopback or virtual and not all-zero. The fingerprint is written at
first start and frozen; a mismatch refuses to start (exit 4) until `meshd accept-host` re-pins it.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat, PublicFormat

from reference.clock import now_rfc3339
from reference.state_dir import StateDir

VIRTUAL_INTERFACE = re.compile(r"^(lo|docker|br-|veth|tap|tun|tailscale|wg|utun|ppp|vboxnet|vmnet|awdl|llw|virbr)")
MACHINE_ID_FILES = (Path("/etc/machine-id"), Path("/var/lib/dbus/machine-id"))


class HostMismatch(Exception):
    """The stored host fingerprint differs from this machine's; the daemon exits 4."""


def write_private(path: Path, data: bytes) -> None:
    """Write ``data`` atomically with mode 0600 (temp file + fsync + rename)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    # req: AUTH-TOKEN-FILE, ID-KEYPAIR -- mode 0600
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    os.chmod(path, 0o600)


def read_host_id(override: str = "") -> str:
    if override:
        return override
    for candidate in MACHINE_ID_FILES:
        try:
            value = candidate.read_text(encoding="ascii").strip()
        except OSError:
            continue
        if value:
            return f"linux:{value}"
    return ""


def read_stable_mac(override: str = "", net_dir: Path = Path("/sys/class/net")) -> str:
    if override:
        return override.lower()
    try:
        names = sorted(os.listdir(net_dir))
    except OSError:
        return ""
    for name in names:
        if VIRTUAL_INTERFACE.match(name):
            continue
        try:
            mac = (net_dir / name / "address").read_text(encoding="ascii").strip().lower()
        except OSError:
            continue
        if mac and mac.replace(":", "").strip("0"):
            return mac
    return ""


def host_fingerprint(host_id: str, stable_mac: str) -> str:
    # req: ID-HOST-FINGERPRINT, ID-HOST-FINGERPRINT-SEPARATOR
    return hashlib.sha256(f"{host_id}\x00{stable_mac}".encode()).hexdigest()


@dataclass(frozen=True)
class HostCheck:
    """The outcome of comparing the stored host fingerprint with this machine."""

    result: str  # first_run | match
    fingerprint: str


def check_host(state_dir: Path, host_id_override: str = "", mac_override: str = "",
               clock: Callable[[], float] = time.time) -> HostCheck:
    """Write the fingerprint on first run, compare it afterwards.

    Raises:
        HostMismatch: with both host ids, so the operator can tell a hardware move from a clone.
    """
    host_id, mac = read_host_id(host_id_override), read_stable_mac(mac_override)
    current = host_fingerprint(host_id, mac)
    path = StateDir(state_dir).host_fingerprint
    # req: ID-HOST-FINGERPRINT -- written at first start, then only compared
    if not path.exists():
        pin_host(state_dir, host_id, mac, clock)
        return HostCheck("first_run", current)
    try:
        stored = json.loads(path.read_text(encoding="utf-8"))
        pinned = stored["fingerprint"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise HostMismatch(f"{path} is unreadable ({exc}); run `meshd accept-host` to re-pin this host") from exc
    # req: ID-MISMATCH-REFUSE
    if pinned != current:
        raise HostMismatch(
            f"host fingerprint mismatch: stored host_id={stored.get('host_id')!r} mac={stored.get('stable_mac')!r}, "
            f"this machine host_id={host_id!r} mac={mac!r}. If this is the same member moved to new hardware, run "
            "`meshd accept-host`; if this state directory was copied to another machine, give it a new identity."
        )
    return HostCheck("match", current)


def pin_host(state_dir: Path, host_id: str, mac: str, clock: Callable[[], float] = time.time) -> str:
    fingerprint = host_fingerprint(host_id, mac)
    document = {
        "schema_version": 1,
        "fingerprint": fingerprint,
        "host_id": host_id,
        "stable_mac": mac,
        "written_at": now_rfc3339(clock),
    }
    write_private(StateDir(state_dir).host_fingerprint, (json.dumps(document, indent=2) + "\n").encode())
    return fingerprint


def accept_host(state_dir: Path, host_id_override: str = "", mac_override: str = "",
                clock: Callable[[], float] = time.time) -> str:
    """Re-pin the host fingerprint to this machine, keeping the keypair (`meshd accept-host`)."""
    # req: ID-ACCEPT-HOST -- the keypair is not touched
    return pin_host(state_dir, read_host_id(host_id_override), read_stable_mac(mac_override), clock)


@dataclass(frozen=True)
class Keypair:
    """The member ed25519 keypair."""

    private: Ed25519PrivateKey

    @property
    def public_hex(self) -> str:
        return self.private.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw).hex()

    def sign(self, data: bytes) -> str:
        return self.private.sign(data).hex()


class IdentityUnreadable(ValueError):
    """keypair.json or local_token exists but cannot be used; the daemon refuses to start (exit 3, E-44) rather than
    mint a new identity over it (the member's key is never replaced behind the operator's back)."""


def load_or_mint_keypair(state_dir: Path) -> tuple[Keypair, bool]:
    """Load keypair.json, or mint one (0600) on first start. Returns (keypair, minted).

    Raises:
        IdentityUnreadable: the file exists but is not a keypair this daemon wrote.
    """
    path = StateDir(state_dir).keypair
    if path.exists():
        try:
            document = json.loads(path.read_text(encoding="utf-8"))
            seed = bytes.fromhex(document["ed25519_seed"])
            keypair = Keypair(Ed25519PrivateKey.from_private_bytes(seed))
        except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as exc:
            raise IdentityUnreadable(
                f"{path} is unreadable ({type(exc).__name__}: {exc}); it holds this member's identity, so meshd will "
                "not replace it: restore it from a backup, or move it aside to mint a new member key") from exc
        if document.get("ed25519_pubkey") not in (None, keypair.public_hex):
            raise IdentityUnreadable(f"{path}: ed25519_pubkey does not belong to ed25519_seed; restore the file")
        return keypair, False
    # req: ID-KEYPAIR
    private = Ed25519PrivateKey.generate()
    seed = private.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())
    keypair = Keypair(private)
    document = {"schema_version": 1, "ed25519_seed": seed.hex(), "ed25519_pubkey": keypair.public_hex}
    write_private(path, (json.dumps(document, indent=2) + "\n").encode())
    return keypair, True


def load_or_mint_token(state_dir: Path) -> str:
    """The local IPC token: 32 random bytes, base64url without padding, in local_token (0600)."""
    path = StateDir(state_dir).local_token
    if path.exists():
        try:
            token = path.read_text(encoding="ascii").strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise IdentityUnreadable(f"{path} is unreadable ({type(exc).__name__}: {exc}); remove it to mint a new "
                                     "token (clients must then read the new one)") from exc
        if token:
            return token
    # req: AUTH-TOKEN-FILE
    token = base64.urlsafe_b64encode(secrets.token_bytes(32)).rstrip(b"=").decode("ascii")
    write_private(path, (token + "\n").encode("ascii"))
    return token


def hello_signature_payload(mesh_id: str, member_id: str, pubkey: str, timestamp: int) -> bytes:
    """What the hello signature covers: `meshId|memberId|pubkey|timestamp` (upstream wire format)."""
    return f"{mesh_id}|{member_id}|{pubkey}|{timestamp}".encode()
