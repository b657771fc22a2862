# cython: language_level=3
"""TLS for the listeners on OpenSSL's memory BIOs (the contract is in
_tls.pxd).  A read's ciphertext goes into the read BIO and every byte
OpenSSL can decrypt from it is read out at once (none is left waiting
inside OpenSSL: Redis's trap with SSL_pending), then handed to the front
in one data_received; OpenSSL's error queue is emptied only after an error,
so it is empty before every call while all goes well; a reply is encrypted with one SSL_write and what the
write BIO holds goes to the socket in one write.  A memory BIO never
blocks, so OpenSSL never wants to write: only a handshake or a read wants
more bytes from the peer."""

import ssl

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.object cimport PyObject

# A read's plaintext is made in pieces of this size.
DEF READ_PIECE = 65536
cdef char PIECE[READ_PIECE]


# CPython's PySSLContext (Modules/_ssl.c) begins with its SSL_CTX: the
# contexts tls.py makes with the ssl module are the only ones used here.
ctypedef struct PySSLContext:
    PyObject ob_base
    SSL_CTX* ctx


cdef SSL_CTX* context_of(object context) except NULL:
    if not isinstance(context, ssl.SSLContext):
        raise TypeError("an ssl.SSLContext is needed")
    return (<PySSLContext*>context).ctx


cdef class TlsConnection:
    """One TLS connection of a listener: the socket's protocol, and the
    transport of `inner`, the front's protocol, whose connection_made comes
    once the handshake has ended.  context is the listener's LiveContext
    (the context in force when the connection arrives, and the owner that
    counts failed handshakes); waiter is set when the handshake ends."""

    def __cinit__(self, loop, inner, context, waiter, double handshake_timeout):
        self.loop = loop
        self.inner = inner
        self.context = context
        self.waiter = waiter
        self.handshake_timeout = handshake_timeout

    def __dealloc__(self):
        if self.ssl != NULL:
            SSL_free(self.ssl)       # and the BIOs it holds

    # ---- the socket's protocol -------------------------------------------------

    def connection_made(self, transport):
        self.transport = transport
        self.start()
        if self.handshake_timeout > 0:
            self.timer = self.loop.call_later(self.handshake_timeout, self.handshake_expired)

    def data_received(self, bytes data):
        if self.closing or self.ssl == NULL:
            return
        if BIO_write(self.rbio, PyBytes_AS_STRING(data), <int>PyBytes_GET_SIZE(data)) \
                != PyBytes_GET_SIZE(data):
            raise MemoryError()
        if not self.handshaken:
            self.handshake()
            if not self.handshaken:
                return
        self.decrypt()

    def eof_received(self):
        # the peer closed without TLS's close_notify, or after it: the
        # front is told, and the connection closes
        if self.handshaken and not self.closing:
            self.inner.eof_received()
        return False

    def connection_lost(self, exc):
        self.lost = True
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if not self.waiter.done():
            self.waiter.set_exception(exc or ConnectionResetError(
                "the connection closed during the TLS handshake"))
        if self.handshaken:
            self.inner.connection_lost(exc)
        self.inner = None

    def pause_writing(self):
        if self.handshaken:
            self.inner.pause_writing()

    def resume_writing(self):
        if self.handshaken:
            self.inner.resume_writing()

    def handshake_expired(self):
        self.timer = None
        if self.handshaken or self.lost:
            return
        if not self.waiter.done():
            self.waiter.set_exception(TimeoutError(
                f"the TLS handshake took longer than {self.handshake_timeout:g} s"))
        self.closing = True
        self.transport.abort()

    # ---- the front's transport ---------------------------------------------------

    def write(self, data):
        cdef bytes b = data if type(data) is bytes else bytes(data)
        cdef int n = <int>PyBytes_GET_SIZE(b)
        if self.closing or self.ssl == NULL or n == 0:
            return
        if SSL_write(self.ssl, PyBytes_AS_STRING(b), n) != n:
            ERR_clear_error()
            self.closing = True
            self.transport.abort()
            return
        self.flush()

    def writelines(self, list_of_data):
        self.write(b"".join(list_of_data))

    def close(self):
        if self.closing:
            return
        self.closing = True
        if self.ssl != NULL and self.handshaken:
            SSL_shutdown(self.ssl)       # our close_notify; the peer's is not awaited
            ERR_clear_error()
            self.flush()
        self.transport.close()

    def abort(self):
        self.closing = True
        self.transport.abort()

    def is_closing(self):
        return self.closing or self.transport.is_closing()

    def can_write_eof(self):
        return False

    def pause_reading(self):
        self.transport.pause_reading()

    def resume_reading(self):
        self.transport.resume_reading()

    def is_reading(self):
        return self.transport.is_reading()

    def get_write_buffer_size(self):
        return self.transport.get_write_buffer_size()

    def get_write_buffer_limits(self):
        return self.transport.get_write_buffer_limits()

    def set_write_buffer_limits(self, high=None, low=None):
        self.transport.set_write_buffer_limits(high, low)

    def get_extra_info(self, name, default=None):
        if name == "sslcontext":
            return self.context.current
        if name in ("ssl_object", "peercert", "cipher", "compression"):
            return default      # no ssl.SSLObject here
        return self.transport.get_extra_info(name, default)

    def get_protocol(self):
        return self.inner

    # ---- OpenSSL -------------------------------------------------------------------

    cdef int start(self) except -1:
        """The connection's SSL object, made from the context in force."""
        self.ssl = SSL_new(context_of(self.context.current))
        self.rbio = BIO_new(BIO_s_mem())
        self.wbio = BIO_new(BIO_s_mem())
        if self.ssl == NULL or self.rbio == NULL or self.wbio == NULL:
            raise MemoryError()
        BIO_set_mem_eof_return(self.rbio, -1)      # empty: "want more", not EOF
        SSL_set_bio(self.ssl, self.rbio, self.wbio)
        SSL_set_mode(self.ssl, SSL_MODE_RELEASE_BUFFERS)   # an idle connection holds none
        SSL_set_accept_state(self.ssl)
        return 0

    cdef int handshake(self) except -1:
        cdef int rc = SSL_do_handshake(self.ssl)
        self.flush()
        if rc == 1:
            self.handshaken = True
            if self.timer is not None:
                self.timer.cancel()
                self.timer = None
            if not self.waiter.done():
                self.waiter.set_result(None)
            self.inner.connection_made(self)
            return 0
        if SSL_get_error(self.ssl, rc) == SSL_ERROR_WANT_READ:
            return 0
        return self.failed(self.error_text())

    cdef int decrypt(self) except -1:
        """Every byte OpenSSL can decrypt from what was read, to the front
        in one call; the peer's close_notify as an EOF."""
        cdef int n, err
        cdef list pieces = None
        cdef bint ended = False
        cdef bytes data
        while True:
            n = SSL_read(self.ssl, PIECE, READ_PIECE)
            if n > 0:
                data = PyBytes_FromStringAndSize(PIECE, n)
                if pieces is None:
                    pieces = [data]
                else:
                    pieces.append(data)
                if SSL_pending(self.ssl) == 0 and BIO_ctrl_pending(self.rbio) == 0:
                    break           # all read: another SSL_read would only say so
                continue
            err = SSL_get_error(self.ssl, n)
            if err == SSL_ERROR_WANT_READ:
                break
            if err == SSL_ERROR_ZERO_RETURN:
                ended = True
                break
            ERR_clear_error()       # the queue stays empty while all goes well
            self.flush()            # the alert OpenSSL made, if any
            self.closing = True
            self.transport.abort()  # a record that does not decrypt
            return 0
        self.flush()                # what reading made (a key update's answer)
        if pieces is not None:
            self.inner.data_received(pieces[0] if len(pieces) == 1 else b"".join(pieces))
        if ended and not self.closing and not self.inner.eof_received():
            self.close()
        return 0

    cdef int flush(self) except -1:
        """What OpenSSL wrote, to the socket in one write."""
        cdef size_t n = BIO_ctrl_pending(self.wbio)
        cdef bytes out
        if n == 0:
            return 0
        out = PyBytes_FromStringAndSize(NULL, n)
        if BIO_read(self.wbio, PyBytes_AS_STRING(out), <int>n) != <int>n:
            raise MemoryError()
        if not self.transport.is_closing():
            self.transport.write(out)
        return 0

    cdef int failed(self, str why) except -1:
        """A handshake that failed: counted (INFO stats
        tls_handshake_failures) and logged as Redis logs it, then closed."""
        error = ssl.SSLError(why)
        error.reason = why
        self.context.owner.handshake_failed(error)
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if not self.waiter.done():
            self.waiter.set_exception(error)
        self.closing = True
        self.transport.abort()
        return 0

    cdef str error_text(self):
        cdef unsigned long e = ERR_get_error()
        cdef const char* reason
        ERR_clear_error()       # the rest of the queue
        if e == 0:
            return "the TLS handshake failed"
        reason = ERR_reason_error_string(e)
        return reason.decode("ascii", "replace").upper().replace(" ", "_") \
            if reason != NULL else "the TLS handshake failed"
