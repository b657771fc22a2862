import asyncio
from typing import Any

class TlsConnection(asyncio.Protocol, asyncio.Transport):
    def __init__(self, loop: asyncio.AbstractEventLoop, inner: Any, context: Any,
                 waiter: asyncio.Future, handshake_timeout: float) -> None: ...
    def handshake_expired(self) -> None: ...
