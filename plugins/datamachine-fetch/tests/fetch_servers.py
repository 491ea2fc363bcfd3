"""Real HTTP(S) servers on loopback for the fetch_url tests, and a host to run the tool in.

Linux routes all of 127.0.0.0/8 to the loopback interface, so a server on 127.0.0.2 stands in
for "an address the site allows" while 127.0.0.1 stays refused: the guard is tested against
real connections without internet access.
"""

from __future__ import annotations

import contextlib
import datetime
import ssl
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from datamachine_fetch import MAX_BYTES

from agents_api import IterationBudget
from datamachine.tools import ToolExecutor


@dataclass(frozen=True)
class Seen:
    """One request a server received."""

    path: str
    host: str  # the Host header
    client_port: int  # tells connections apart
    cookie: str | None


class Server:
    """A loopback HTTP server that records the requests it served.

    ``address``/``port``: where to listen (port 0: a free one). ``redirect_to``: where
    ``/away`` redirects. ``tls``: serve HTTPS with this server context.
    """

    def __init__(self, address: str = "127.0.0.1", port: int = 0, *,
                 redirect_to: str = "", tls: ssl.SSLContext | None = None) -> None:
        self.seen: list[Seen] = []
        self.release = threading.Event()  # /hang waits on it
        self.redirect_to = redirect_to
        self.httpd = ThreadingHTTPServer((address, port), _handler(self))
        self.httpd.daemon_threads = True
        if tls is not None:
            self.httpd.socket = tls.wrap_socket(self.httpd.socket, server_side=True)
        self.port = self.httpd.server_address[1]
        scheme = "https" if tls is not None else "http"
        self.url = f"{scheme}://{address}:{self.port}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.01,),
                                       daemon=True)

    @property
    def paths(self) -> list[str]:
        """The paths served, in order."""
        return [request.path for request in self.seen]

    def __enter__(self) -> Server:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=30)


def _handler(server: Server) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        # HTTP/1.1 keeps connections open, so a client that reused one would show it.
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            server.seen.append(Seen(self.path, self.headers.get("Host", ""),
                                    self.client_address[1], self.headers.get("Cookie")))
            path = self.path.split("?")[0]
            if path == "/page":
                self._send(200, "text/html; charset=utf-8", "<h1>Héllo</h1>".encode())
            elif path == "/big":
                self._send(200, "text/plain", b"x" * (MAX_BYTES + 5000))
            elif path == "/latin":
                self._send(200, "text/plain; charset=iso-8859-1", "café".encode("latin-1"))
            elif path == "/cookie":
                self._send(200, "text/plain", b"have one", ("Set-Cookie", "session=1; Path=/"))
            elif path in ("/redirect", "/away", "/loop"):
                target = {"/redirect": "/page", "/away": server.redirect_to}.get(path, "/loop")
                self._send(302, "text/plain", b"", ("Location", target))
            elif path == "/hang":
                server.release.wait(10)
                self._send(200, "text/plain", b"late")
            else:
                self._send(404, "text/plain", b"no such page")

        def _send(self, status: int, content_type: str, body: bytes,
                  *extra: tuple[str, str]) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            for name, value in extra:
                self.send_header(name, value)
            self.end_headers()
            # The client may stop reading early (truncation, timeout).
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler


def fetch(executor: ToolExecutor, url: str, budgets: dict[str, IterationBudget],
          call_id: str = "c1") -> dict[str, Any]:
    """Run one fetch_url call through ``executor`` and return its result."""
    result = executor({"id": call_id, "name": "fetch_url", "parameters": {"url": url}},
                      {"turn": 1, "budgets": budgets})
    assert isinstance(result, dict)
    return result


def certificates(directory: Path, name: str) -> tuple[Path, ssl.SSLContext]:
    """A new certificate authority (its PEM file) and a server context whose certificate,
    signed by it, is valid for ``name`` only."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)

    def issue(subject: str, key: Any, issuer: x509.Name, signer: Any, ca: bool) -> Any:
        builder = (x509.CertificateBuilder()
                   .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
                   .issuer_name(issuer).public_key(key.public_key())
                   .serial_number(x509.random_serial_number())
                   .not_valid_before(now - datetime.timedelta(hours=1))
                   .not_valid_after(now + datetime.timedelta(hours=1))
                   .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
        if ca:
            builder = builder.add_extension(x509.KeyUsage(
                digital_signature=True, key_cert_sign=True, crl_sign=True,
                content_commitment=False, key_encipherment=False, data_encipherment=False,
                key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
        else:
            builder = builder.add_extension(
                x509.SubjectAlternativeName([x509.DNSName(subject)]), critical=False)
        return builder.sign(signer, hashes.SHA256())

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fetch test CA")])
    ca_cert = issue("fetch test CA", ca_key, ca_name, ca_key, ca=True)
    leaf_key = ec.generate_private_key(ec.SECP256R1())
    leaf = issue(name, leaf_key, ca_name, ca_key, ca=False)
    pem = serialization.Encoding.PEM
    ca_file = directory / "ca.pem"
    ca_file.write_bytes(ca_cert.public_bytes(pem))
    chain = directory / "server.pem"
    chain.write_bytes(leaf.public_bytes(pem) + leaf_key.private_bytes(
        pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(chain)
    return ca_file, context
