"""The enrollment exchange between a machine (`gitops hypervisor init`) and the fleet (`gitops hypervisor add`).

Only a certificate request, certificates and hashes cross; no private key. The machine serves, over TLS
with its own new key (a self-signed certificate), its request on `GET /v1/request`, and waits for
`POST /v1/certificate`. Each side pins the other by a hash the operator carried by hand:

* the fleet pins the machine by its key (`--fingerprint`, printed by `init`): the TLS session's key, and
  the request's, must hash to it, so the fleet signs that machine's key and no other;
* the machine pins the fleet by its CA (`--ca-hash`, printed by `gitops hypervisor ca-hash`): the CA
  delivered must hash to it, and the certificate must be signed by it for the machine's own key and
  address. Only the holder of that CA's key can produce such a certificate.

Anything else is refused with a message naming what did not match, and the machine keeps waiting.
"""
from __future__ import annotations

import datetime as dt
import http.client
import http.server
import ipaddress
import json
import re
import ssl
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID

from gitops.errors import GitopsError
from gitops.pki import PKIError, PrivateKey, cert_to_pem, is_signed_by, key_hash, key_to_pem, load_cert_pem, load_csr_pem
from gitops.pki.x509 import make_csr, self_signed

REQUEST_PATH = "/v1/request"
CERTIFICATE_PATH = "/v1/certificate"
MAX_BODY = 64 << 10
HASH = re.compile(r"^sha256:[0-9a-f]{64}$")


class EnrollError(GitopsError):
    """The exchange failed, or what the other side sent does not check out."""


def check_hash(value: str, what: str) -> str:
    if not HASH.match(value or ""):
        raise EnrollError(f"{what} must be sha256: and 64 lowercase hex digits (got {value!r})")
    return value


#: a network interface's name as the Hypervisor schema takes it (spec.interface)
_INTERFACE = re.compile(r"^[A-Za-z0-9_.@-]{1,15}$")


@dataclass(frozen=True)
class Request:
    """What a machine asks the fleet to sign: its key (in a CSR), its address and CRI port, its data dir, and
    the ports it reserved for gitops's pods (kept out of its ephemeral ports)."""

    csr_pem: str
    address: str
    cri_port: int
    data_dir: str
    port_low: int = 0
    port_high: int = 0
    #: the network interface holding `address` (a virtual IP the machine holds goes there)
    interface: str = ""

    def to_json(self) -> dict[str, object]:
        return {"csr": self.csr_pem, "address": self.address, "criPort": self.cri_port, "dataDir": self.data_dir,
                "portRange": [self.port_low, self.port_high], "interface": self.interface}

    @classmethod
    def from_json(cls, raw: object) -> Request:
        try:
            assert isinstance(raw, dict)
            low, high = raw.get("portRange", (0, 0))
            interface = str(raw.get("interface", ""))
            if interface and not _INTERFACE.match(interface):
                raise ValueError(interface)
            return cls(str(raw["csr"]), str(raw["address"]), int(raw["criPort"]), str(raw.get("dataDir", "")),
                       int(low), int(high), interface)
        except (AssertionError, KeyError, TypeError, ValueError):
            raise EnrollError("the machine's request is not a gitops enrollment request") from None


def csr_for(key: PrivateKey, address: str) -> str:
    """A CSR for `key` naming `address` (the fleet sets the certificate's contents itself; the CSR proves the
    key is held)."""
    return make_csr(key, f"cri-{address}", [address])


def enroll_certificate(key: PrivateKey, address: str) -> str:
    """The certificate the machine presents while it enrolls: its own key, signed by itself (the fleet pins
    the key, not a CA)."""
    return cert_to_pem(self_signed(key, f"gitops-enroll-{address}", [address]))


def check_delivery(ca_pem: str, cert_pem: str, key: PrivateKey, address: str, ca_hash: str,
                   now: dt.datetime | None = None) -> None:
    """What the machine accepts: a CA hashing to `ca_hash`, and a server certificate it signed for this key
    and this address, valid now. EnrollError names the first thing that does not match."""
    try:
        ca, cert = load_cert_pem(ca_pem), load_cert_pem(cert_pem)
    except PKIError as err:
        raise EnrollError(f"unreadable certificate: {err}") from None
    got = key_hash(ca.public_key())
    if got != ca_hash:
        raise EnrollError(f"the fleet's CA is {got}, not {ca_hash} that this machine was told to trust "
                          "(gitops hypervisor init --ca-hash; `gitops hypervisor ca-hash` prints the fleet's)")
    try:
        is_ca = ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    except x509.ExtensionNotFound:
        is_ca = False
    if not is_ca:
        raise EnrollError("the CA delivered is not a CA certificate")
    if not is_signed_by(cert, ca):
        raise EnrollError("the certificate delivered is not signed by the fleet's CA")
    if key_hash(cert.public_key()) != key_hash(key.public_key()):
        raise EnrollError("the certificate delivered is for another key than this machine's")
    try:
        ips = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(
            x509.IPAddress)
        usages = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    except x509.ExtensionNotFound:
        raise EnrollError("the certificate delivered names no address or no usage") from None
    if ipaddress.ip_address(address) not in ips:
        raise EnrollError(f"the certificate delivered does not name this machine's address {address}")
    if ExtendedKeyUsageOID.SERVER_AUTH not in usages:
        raise EnrollError("the certificate delivered is not for a TLS server")
    moment = now or dt.datetime.now(dt.timezone.utc)
    if not cert.not_valid_before_utc <= moment <= cert.not_valid_after_utc:
        raise EnrollError("the certificate delivered is not valid now (check both machines' clocks)")


@dataclass(frozen=True)
class Delivered:
    ca_pem: str
    cert_pem: str


class Enrollment:
    """The machine's side: serves its request on `address:port` until a delivery checks out (`wait`)."""

    def __init__(self, key: PrivateKey, request: Request, ca_hash: str):
        self.key, self.request, self.ca_hash = key, request, check_hash(ca_hash, "--ca-hash")
        self.delivered: Delivered | None = None
        self.refusals: list[str] = []
        self._done = threading.Event()
        enrollment = self

        class Handler(http.server.BaseHTTPRequestHandler):
            timeout = 10  # a peer that says nothing (nor finishes its TLS handshake) is dropped, not waited for

            def log_message(self, *_args: object) -> None:  # the command says what matters itself
                pass

            def _answer(self, status: int, body: dict[str, object]) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                if self.path != REQUEST_PATH:
                    return self._answer(404, {"error": "not found"})
                self._answer(200, enrollment.request.to_json())

            def do_POST(self) -> None:  # noqa: N802
                if self.path != CERTIFICATE_PATH:
                    return self._answer(404, {"error": "not found"})
                length = int(self.headers.get("Content-Length") or 0)
                if not 0 < length <= MAX_BODY:
                    return self._answer(413, {"error": f"a delivery is at most {MAX_BODY} bytes"})
                try:
                    raw = json.loads(self.rfile.read(length))
                    ca_pem, cert_pem = str(raw["ca"]), str(raw["certificate"])
                    check_delivery(ca_pem, cert_pem, enrollment.key, enrollment.request.address, enrollment.ca_hash)
                except EnrollError as err:
                    enrollment.refusals.append(str(err))
                    return self._answer(400, {"error": str(err)})
                except (ValueError, KeyError, TypeError):
                    return self._answer(400, {"error": "a delivery is JSON with `ca` and `certificate`"})
                enrollment.delivered = Delivered(ca_pem, cert_pem)
                self._answer(200, {"installed": True})
                enrollment._done.set()

        self.server = http.server.ThreadingHTTPServer((request.address, request.cri_port), Handler)
        self.server.daemon_threads = True  # a silent peer holds only its own thread, for its handler's timeout
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        with tempfile.TemporaryDirectory(prefix="gitops-enroll-") as tmp:  # ssl loads a key only from a file
            pem = Path(tmp) / "enroll.pem"
            pem.touch(mode=0o600)
            pem.write_text(enroll_certificate(key, request.address) + key_to_pem(key))
            context.load_cert_chain(str(pem))
        # the handshake happens on the handler's first read, under its timeout (not in accept(), unbounded)
        self.server.socket = context.wrap_socket(self.server.socket, server_side=True, do_handshake_on_connect=False)
        self.server.timeout = 0.5

    def wait(self, timeout: float) -> Delivered:
        """Serve until a delivery checks out (or `timeout` seconds pass: EnrollError)."""
        import time

        deadline = time.monotonic() + timeout
        try:
            while not self._done.is_set():
                if time.monotonic() > deadline:
                    why = f"; refused: {self.refusals[-1]}" if self.refusals else ""
                    raise EnrollError(f"no certificate delivered within {timeout:g}s "
                                      f"(run `gitops hypervisor add` where gitops runs){why}")
                try:
                    self.server.handle_request()
                except (OSError, ssl.SSLError):
                    continue  # a client that went away, or spoke no TLS
        finally:
            self.server.server_close()
        assert self.delivered is not None
        return self.delivered


# ---------------------------------------------------------------------------- the fleet's side

def _connect(address: str, port: int, fingerprint: str, timeout: float) -> http.client.HTTPSConnection:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE  # pinned below, by the key's hash: the machine has no CA yet
    conn = http.client.HTTPSConnection(address, port, context=context, timeout=timeout)
    try:
        conn.connect()
        assert conn.sock is not None
        der = conn.sock.getpeercert(binary_form=True)  # type: ignore[union-attr]
    except OSError as err:
        conn.close()
        raise EnrollError(f"cannot reach the machine at {address}:{port} ({err}): is `gitops hypervisor init` "
                          "running there?") from None
    got = key_hash(x509.load_der_x509_certificate(der).public_key()) if der else ""
    if got != fingerprint:
        conn.close()
        raise EnrollError(f"the machine at {address}:{port} presents key {got or 'none'}, not {fingerprint} "
                          "(--fingerprint, as `gitops hypervisor init` printed it): not the machine meant")
    return conn


def fetch_request(address: str, port: int, fingerprint: str, timeout: float = 10) -> tuple[Request, x509.CertificateSigningRequest]:
    """The machine's request, its CSR checked: signed by the pinned key and naming `address`."""
    check_hash(fingerprint, "--fingerprint")
    conn = _connect(address, port, fingerprint, timeout)
    try:
        conn.request("GET", REQUEST_PATH)
        response = conn.getresponse()
        body = response.read(MAX_BODY + 1)
    except (OSError, http.client.HTTPException) as err:
        raise EnrollError(f"the machine at {address}:{port} did not answer: {err}") from None
    finally:
        conn.close()
    if response.status != 200 or len(body) > MAX_BODY:
        raise EnrollError(f"the machine at {address}:{port} answered {response.status}: is it enrolling?")
    try:
        request = Request.from_json(json.loads(body))
    except ValueError:
        raise EnrollError("the machine's request is not JSON") from None
    try:
        csr = load_csr_pem(request.csr_pem)
    except PKIError as err:
        raise EnrollError(f"the machine's certificate request: {err}") from None
    if key_hash(csr.public_key()) != fingerprint:
        raise EnrollError("the machine's certificate request is for another key than the one it presents")
    if request.address != address or request.cri_port != port:
        raise EnrollError(f"the machine enrolls as {request.address}:{request.cri_port}, not {address}:{port}")
    return request, csr


def deliver(address: str, port: int, fingerprint: str, ca_pem: str, cert_pem: str, timeout: float = 10) -> None:
    """Hand the signed certificate and the fleet's CA to the machine; EnrollError with its reason if it refuses."""
    conn = _connect(address, port, fingerprint, timeout)
    try:
        conn.request("POST", CERTIFICATE_PATH, json.dumps({"ca": ca_pem, "certificate": cert_pem}),
                     {"Content-Type": "application/json"})
        response = conn.getresponse()
        body = response.read(MAX_BODY)
    except (OSError, http.client.HTTPException) as err:
        raise EnrollError(f"the machine at {address}:{port} did not answer the delivery: {err}") from None
    finally:
        conn.close()
    if response.status != 200:
        try:
            reason = str(json.loads(body)["error"])
        except (ValueError, KeyError, TypeError):
            reason = repr(body[:200])
        raise EnrollError(f"the machine at {address}:{port} refused the certificate: {reason}")
