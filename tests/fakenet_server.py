"""The fake internet's servers (run inside its network namespace by ``fakenet.py``).

Usage: ``fakenet_server.py NAME=ADDR:PORT ... [--udp ADDR:PORT] [--cert PEM --tls
NAME=ADDR:PORT ...]``: an HTTP server per ``NAME=ADDR:PORT`` (``--tls``: HTTPS with the
certificate and key in ``PEM``) answering every GET with ``fakenet NAME``; ``GET /udp`` on any
of them lists the datagrams the UDP sink received (``<source address> <payload>`` a line),
``GET /bytes/<n>`` sends ``n`` bytes (throughput). Prints ``ready`` once every socket listens.
"""

from __future__ import annotations

import asyncio
import ssl
import sys

CHUNK = b"x" * 65536
received: list[str] = []


class Sink(asyncio.DatagramProtocol):
    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        if len(received) < 1000:
            received.append(f"{addr[0]} {data[:100].decode(errors='replace')}")


def handler(name: str):  # type: ignore[no-untyped-def]
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            line = await reader.readline()
            headers = []
            while (header := await reader.readline()).strip():
                headers.append(header.decode(errors="replace"))
            path = line.split()[1].decode() if len(line.split()) > 1 else "/"
            if path == "/headers":  # what reached the server (the egress proxy's injections)
                data = "".join(headers).encode()
                writer.write(b"HTTP/1.0 200 OK\r\nContent-Length: %d\r\n\r\n" % len(data) + data)
            elif path.startswith("/bytes/"):
                size = int(path[len("/bytes/") :])
                writer.write(b"HTTP/1.0 200 OK\r\nContent-Length: %d\r\n\r\n" % size)
                while size > 0:
                    writer.write(CHUNK[: min(size, len(CHUNK))])
                    size -= len(CHUNK)
                    await writer.drain()
            else:
                body = "\n".join(received) + "\n" if path == "/udp" else f"fakenet {name}\n"
                data = body.encode()
                writer.write(b"HTTP/1.0 200 OK\r\nContent-Length: %d\r\n\r\n" % len(data) + data)
            await writer.drain()
        except (ConnectionError, ValueError, IndexError):
            pass
        finally:
            writer.close()

    return serve


async def main(args: list[str]) -> None:
    loop = asyncio.get_running_loop()
    servers = []
    it = iter(args)
    tls: ssl.SSLContext | None = None
    for arg in it:
        if arg == "--udp":
            host, port = next(it).rsplit(":", 1)
            await loop.create_datagram_endpoint(Sink, local_addr=(host, int(port)))
            continue
        if arg == "--cert":
            tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            tls.load_cert_chain(next(it))
            continue
        secure = arg == "--tls"
        name, _, where = (next(it) if secure else arg).partition("=")
        host, port = where.rsplit(":", 1)
        context = tls if secure else None
        servers.append(await asyncio.start_server(handler(name), host, int(port), ssl=context))
    print("ready", flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
