# TLS for the listeners on OpenSSL's memory BIOs, driven from C: one
# TlsConnection is both the socket's protocol and the transport of the
# front's protocol it carries (a RESP, HTTP or gRPC connection), so a read
# is decrypted and handed on, and a reply encrypted and written, with no
# Python layer between (uvloop's SSLProtocol put one there).  The SSL
# objects come from the SSL_CTX of Python's ssl.SSLContext that tls.py
# makes, so certificates, client verification, protocols, ciphers and ALPN
# are that context's.

from libc.stdint cimport int64_t


cdef extern from "openssl/ssl.h":
    ctypedef struct SSL_CTX
    ctypedef struct SSL
    ctypedef struct BIO
    ctypedef struct BIO_METHOD
    enum:
        SSL_ERROR_NONE
        SSL_ERROR_SSL
        SSL_ERROR_WANT_READ
        SSL_ERROR_WANT_WRITE
        SSL_ERROR_SYSCALL
        SSL_ERROR_ZERO_RETURN
        SSL_MODE_RELEASE_BUFFERS
    SSL* SSL_new(SSL_CTX* ctx) nogil
    void SSL_free(SSL* s) nogil
    void SSL_set_accept_state(SSL* s) nogil
    void SSL_set_bio(SSL* s, BIO* rbio, BIO* wbio) nogil
    int SSL_do_handshake(SSL* s) nogil
    int SSL_read(SSL* s, void* buf, int num) nogil
    int SSL_write(SSL* s, const void* buf, int num) nogil
    int SSL_get_error(const SSL* s, int ret) nogil
    int SSL_pending(const SSL* s) nogil
    int SSL_shutdown(SSL* s) nogil
    long SSL_set_mode(SSL* s, long mode) nogil
    const BIO_METHOD* BIO_s_mem() nogil
    BIO* BIO_new(const BIO_METHOD* method) nogil
    int BIO_free(BIO* b) nogil
    int BIO_write(BIO* b, const void* data, int dlen) nogil
    int BIO_read(BIO* b, void* data, int dlen) nogil
    size_t BIO_ctrl_pending(BIO* b) nogil
    long BIO_set_mem_eof_return(BIO* b, long v) nogil


cdef extern from "openssl/err.h":
    unsigned long ERR_get_error() nogil
    void ERR_clear_error() nogil
    void ERR_error_string_n(unsigned long e, char* buf, size_t len) nogil
    const char* ERR_reason_error_string(unsigned long e) nogil


cdef class TlsConnection:
    cdef object loop
    cdef object inner            # the front's protocol
    cdef object transport        # the socket's
    cdef object context          # tls.LiveContext: the SSLContext in force, its owner
    cdef object waiter           # set when the handshake ends (admission.py counts it)
    cdef object timer            # the handshake's deadline
    cdef double handshake_timeout
    cdef SSL* ssl
    cdef BIO* rbio               # ciphertext read from the socket, for OpenSSL
    cdef BIO* wbio               # ciphertext OpenSSL made, for the socket
    cdef bint handshaken
    cdef bint closing
    cdef bint lost

    cdef int start(self) except -1
    cdef int handshake(self) except -1
    cdef int decrypt(self) except -1
    cdef int flush(self) except -1
    cdef int failed(self, str why) except -1
    cdef str error_text(self)
