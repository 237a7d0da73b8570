"""A server that answers PostgreSQL's TLS request with a certificate no client should trust.

It speaks just enough of the protocol for a client's TLS verification to fail as it does
against a real server: it reads the `SSLRequest`, answers `S` (TLS spoken here), and
shakes hands with a self-signed certificate issued for another name.
"""

from __future__ import annotations

import contextlib
import datetime
import socket
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path


def self_signed(directory: Path, name: str) -> tuple[Path, Path]:
    """A self-signed certificate for DNS name `name` and its key, written to `directory`."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / f"{name}.crt", directory / f"{name}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


@contextlib.contextmanager
def tls_postgres(directory: Path) -> Iterator[tuple[int, Path]]:
    """A server on 127.0.0.1 whose certificate is for `db.example`: (its port, the cert).

    A client that trusts the certificate (`sslrootcert`) and checks the host
    (`sslmode=verify-full`) still refuses it: it was not issued for 127.0.0.1.
    """
    cert, key = self_signed(directory, "db.example")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.1)
    done = threading.Event()

    def serve() -> None:
        for _ in range(6000):  # at most ten minutes
            if done.is_set():
                return
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            with conn, contextlib.suppress(OSError):
                conn.settimeout(5)
                conn.recv(8)  # SSLRequest: length 8, code 80877103
                conn.sendall(b"S")
                with context.wrap_socket(conn, server_side=True):
                    pass  # the client gives up in the handshake

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1], cert
    finally:
        done.set()
        thread.join(timeout=10)
        listener.close()
