# libnghttp2's C API, the part the gRPC front (_grpc.pyx) uses: Debian's
# libnghttp2-dev, nghttp2/nghttp2.h.  Declarations only, no module of its
# own (as httptools keeps llhttp's in cparser.pxd, uvloop libuv's in
# includes/uv.pxd).

from libc.stdint cimport int32_t, uint8_t, uint32_t


cdef extern from "nghttp2/nghttp2.h" nogil:
    ctypedef struct nghttp2_session:
        pass
    ctypedef struct nghttp2_session_callbacks:
        pass
    ctypedef struct nghttp2_option:
        pass

    ctypedef struct nghttp2_frame_hd:
        size_t length
        int32_t stream_id
        uint8_t type
        uint8_t flags

    ctypedef enum nghttp2_headers_category:
        NGHTTP2_HCAT_REQUEST
        NGHTTP2_HCAT_RESPONSE
        NGHTTP2_HCAT_PUSH_RESPONSE
        NGHTTP2_HCAT_HEADERS

    ctypedef struct nghttp2_headers:
        nghttp2_frame_hd hd
        nghttp2_headers_category cat

    ctypedef struct nghttp2_goaway:
        nghttp2_frame_hd hd
        int32_t last_stream_id
        uint32_t error_code

    ctypedef union nghttp2_frame:
        nghttp2_frame_hd hd
        nghttp2_headers headers
        nghttp2_goaway goaway

    ctypedef struct nghttp2_nv:
        uint8_t* name
        uint8_t* value
        size_t namelen
        size_t valuelen
        uint8_t flags

    ctypedef union nghttp2_data_source:
        int fd
        void* ptr

    ctypedef ssize_t (*nghttp2_data_source_read_callback)(
        nghttp2_session* session, int32_t stream_id, uint8_t* buf, size_t length,
        uint32_t* data_flags, nghttp2_data_source* source, void* user_data) noexcept

    ctypedef struct nghttp2_data_provider:
        nghttp2_data_source source
        nghttp2_data_source_read_callback read_callback

    ctypedef struct nghttp2_settings_entry:
        int32_t settings_id
        uint32_t value

    ctypedef void* (*nghttp2_malloc)(size_t size, void* mem_user_data) noexcept
    ctypedef void (*nghttp2_free)(void* ptr, void* mem_user_data) noexcept
    ctypedef void* (*nghttp2_calloc)(size_t nmemb, size_t size, void* mem_user_data) noexcept
    ctypedef void* (*nghttp2_realloc)(void* ptr, size_t size, void* mem_user_data) noexcept

    ctypedef struct nghttp2_mem:
        void* mem_user_data
        nghttp2_malloc malloc
        nghttp2_free free
        nghttp2_calloc calloc
        nghttp2_realloc realloc

    enum:
        NGHTTP2_DATA = 0
        NGHTTP2_HEADERS = 1
        NGHTTP2_RST_STREAM = 3
        NGHTTP2_SETTINGS = 4
        NGHTTP2_GOAWAY = 7
        NGHTTP2_FLAG_NONE = 0
        NGHTTP2_FLAG_END_STREAM = 1
        NGHTTP2_NV_FLAG_NONE = 0
        NGHTTP2_NV_FLAG_NO_COPY_NAME = 2
        NGHTTP2_NV_FLAG_NO_COPY_VALUE = 4
        NGHTTP2_DATA_FLAG_EOF = 1
        NGHTTP2_DATA_FLAG_NO_END_STREAM = 2
        NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS = 3
        NGHTTP2_SETTINGS_MAX_HEADER_LIST_SIZE = 6
        NGHTTP2_NO_ERROR = 0
        NGHTTP2_PROTOCOL_ERROR = 1
        NGHTTP2_INTERNAL_ERROR = 2
        NGHTTP2_REFUSED_STREAM = 7
        NGHTTP2_ENHANCE_YOUR_CALM = 11
        NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE = -521
        NGHTTP2_ERR_CALLBACK_FAILURE = -902

    ctypedef int (*nghttp2_on_begin_headers_callback)(
        nghttp2_session* session, const nghttp2_frame* frame, void* user_data) noexcept
    ctypedef int (*nghttp2_on_header_callback)(
        nghttp2_session* session, const nghttp2_frame* frame, const uint8_t* name,
        size_t namelen, const uint8_t* value, size_t valuelen, uint8_t flags,
        void* user_data) noexcept
    ctypedef int (*nghttp2_on_data_chunk_recv_callback)(
        nghttp2_session* session, uint8_t flags, int32_t stream_id, const uint8_t* data,
        size_t len, void* user_data) noexcept
    ctypedef int (*nghttp2_on_frame_recv_callback)(
        nghttp2_session* session, const nghttp2_frame* frame, void* user_data) noexcept
    ctypedef int (*nghttp2_on_frame_send_callback)(
        nghttp2_session* session, const nghttp2_frame* frame, void* user_data) noexcept
    ctypedef int (*nghttp2_on_stream_close_callback)(
        nghttp2_session* session, int32_t stream_id, uint32_t error_code,
        void* user_data) noexcept

    int nghttp2_session_callbacks_new(nghttp2_session_callbacks** callbacks_ptr)
    void nghttp2_session_callbacks_set_on_begin_headers_callback(
        nghttp2_session_callbacks* cbs, nghttp2_on_begin_headers_callback cb)
    void nghttp2_session_callbacks_set_on_header_callback(
        nghttp2_session_callbacks* cbs, nghttp2_on_header_callback cb)
    void nghttp2_session_callbacks_set_on_data_chunk_recv_callback(
        nghttp2_session_callbacks* cbs, nghttp2_on_data_chunk_recv_callback cb)
    void nghttp2_session_callbacks_set_on_frame_recv_callback(
        nghttp2_session_callbacks* cbs, nghttp2_on_frame_recv_callback cb)
    void nghttp2_session_callbacks_set_on_frame_send_callback(
        nghttp2_session_callbacks* cbs, nghttp2_on_frame_send_callback cb)
    void nghttp2_session_callbacks_set_on_stream_close_callback(
        nghttp2_session_callbacks* cbs, nghttp2_on_stream_close_callback cb)

    int nghttp2_option_new(nghttp2_option** option_ptr)
    void nghttp2_option_set_no_closed_streams(nghttp2_option* option, int val)

    int nghttp2_session_server_new3(nghttp2_session** session_ptr,
                                    const nghttp2_session_callbacks* callbacks,
                                    void* user_data, const nghttp2_option* option,
                                    nghttp2_mem* mem)
    void nghttp2_session_del(nghttp2_session* session)
    ssize_t nghttp2_session_mem_recv(nghttp2_session* session, const uint8_t* data,
                                     size_t length)
    ssize_t nghttp2_session_mem_send(nghttp2_session* session, const uint8_t** data_ptr)
    int nghttp2_session_want_read(nghttp2_session* session)
    int nghttp2_session_want_write(nghttp2_session* session)
    void* nghttp2_session_get_stream_user_data(nghttp2_session* session, int32_t stream_id)
    int nghttp2_session_set_stream_user_data(nghttp2_session* session, int32_t stream_id,
                                             void* stream_user_data)
    int nghttp2_session_get_stream_remote_close(nghttp2_session* session, int32_t stream_id)
    int32_t nghttp2_session_get_last_proc_stream_id(nghttp2_session* session)
    int nghttp2_session_terminate_session(nghttp2_session* session, uint32_t error_code)
    int nghttp2_submit_settings(nghttp2_session* session, uint8_t flags,
                                const nghttp2_settings_entry* iv, size_t niv)
    int nghttp2_submit_response(nghttp2_session* session, int32_t stream_id,
                                const nghttp2_nv* nva, size_t nvlen,
                                const nghttp2_data_provider* data_prd)
    int nghttp2_submit_trailer(nghttp2_session* session, int32_t stream_id,
                               const nghttp2_nv* nva, size_t nvlen)
    int nghttp2_submit_rst_stream(nghttp2_session* session, uint8_t flags, int32_t stream_id,
                                  uint32_t error_code)
    int nghttp2_submit_goaway(nghttp2_session* session, uint8_t flags, int32_t last_stream_id,
                              uint32_t error_code, const uint8_t* opaque_data,
                              size_t opaque_data_len)
    int nghttp2_submit_shutdown_notice(nghttp2_session* session)
    const char* nghttp2_strerror(int lib_error_code)
