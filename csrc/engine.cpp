// rlsync._engine: the native TCP data plane's byte movers.
//
// Two calls do the work of the `tcp` transport (hub/transports/tcp_native.py):
//   send_frame(fd, header, segments, timeout_ms, zero_copy) -> header + every (address, length)
//       segment, by sendmsg over an iovec (no staging copy, large writes), until all bytes are in the
//       kernel; with zero_copy, the segments' pages go to the socket by reference (vmsplice into a
//       pipe, splice to the socket): the kernel then reads the source memory until the peer has
//       consumed the bytes, so the caller must not change it before the reader says it is done;
//   recv_segments(fd, segments, timeout_ms, checksum) -> fill the reader's registered buffers
//       straight from the socket (no intermediate copy) and, when asked, hash each piece with
//       xxh3-64 while it is still in cache: the unit's checksum costs no second pass over memory.
//   read_process(pid, pieces, checksum) -> the `shm` transport's same-host copy: process_vm_readv
//       out of the source process, hashed while hot as above.
// All run with the GIL released. The fd may be non-blocking (a Python socket with a timeout):
// EAGAIN waits in poll(), and a peer silent for timeout_ms raises TimeoutError. Peer death raises
// PeerClosedError (a ConnectionError); other socket errors raise OSError with errno. Lengths come
// from the validated manifest, never from the wire, so a malformed frame cannot steer a write.
// Framing, tickets and relay waits stay in Python (hub/dataplane.py), once for every transport.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <fcntl.h>
#include <poll.h>
#include <unistd.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/uio.h>

#define XXH_INLINE_ALL
#include "third_party/xxhash/xxhash.h"
#if defined(__x86_64__) || defined(__i386__)
#include "third_party/xxhash/xxh_x86dispatch.h"  // xxh3_dispatch.cpp: the widest SIMD this CPU has
#define RLSYNC_XXH3_UPDATE XXH3_64bits_update_dispatch
#else
#define RLSYNC_XXH3_UPDATE XXH3_64bits_update
#endif

namespace py = pybind11;

namespace {

using Segment = std::pair<std::uintptr_t, std::size_t>;

struct PeerClosed : std::runtime_error { using std::runtime_error::runtime_error; };
struct Timeout : std::runtime_error { using std::runtime_error::runtime_error; };
struct SysError : std::runtime_error {
    int err;
    SysError(int e, const std::string& what) : std::runtime_error(what + ": " + std::strerror(e)), err(e) {}
};

// Bytes hashed per recv() while they are hot in L2 (hashing a cold 1 GiB afterwards runs at memory
// speed, ~3 GB/s here; hot, xxh3 with AVX2 runs at ~27 GB/s).
constexpr std::size_t kHashChunk = 256 << 10;
constexpr int kIovBatch = 512;  // below IOV_MAX (1024)
// While waiting for data, ask the kernel to wake us only once this much has queued (SO_RCVLOWAT):
// loopback delivers 64 KiB skbs, and a wake-up per skb cost 5-40% of a single stream here.
constexpr int kLowat = 512 << 10;

[[noreturn]] void raise_errno(int e, const char* what) {
    if (e == ECONNRESET || e == EPIPE || e == ENOTCONN) throw PeerClosed(std::string(what) + ": peer went away (" + std::strerror(e) + ")");
    throw SysError(e, what);
}

// Wait until fd is ready for `events`; throw Timeout after timeout_ms (<0: wait forever).
void wait_ready(int fd, short events, int timeout_ms, const char* what) {
    for (;;) {
        pollfd p{fd, events, 0};
        int r = ::poll(&p, 1, timeout_ms);
        if (r > 0) return;  // ready, or POLLERR/POLLHUP: the next syscall reports it
        if (r == 0) throw Timeout(std::string(what) + ": peer silent for " + std::to_string(timeout_ms) + " ms");
        if (errno != EINTR) raise_errno(errno, "poll");
    }
}

std::size_t send_frame_nogil(int fd, const std::string& header, const std::vector<Segment>& segs, int timeout_ms,
                             int extra_flags = 0) {
    std::vector<iovec> iov;
    iov.reserve(segs.size() + 1);
    if (!header.empty()) iov.push_back({const_cast<char*>(header.data()), header.size()});
    std::size_t total = header.size();
    for (const auto& s : segs) {
        if (s.second == 0) continue;
        iov.push_back({reinterpret_cast<void*>(s.first), s.second});
        total += s.second;
    }
    std::size_t i = 0;
    while (i < iov.size()) {
        msghdr msg{};
        msg.msg_iov = &iov[i];
        msg.msg_iovlen = std::min<std::size_t>(iov.size() - i, kIovBatch);
        ssize_t n = ::sendmsg(fd, &msg, MSG_NOSIGNAL | extra_flags);
        if (n < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) { wait_ready(fd, POLLOUT, timeout_ms, "send"); continue; }
            raise_errno(errno, "sendmsg");
        }
        std::size_t left = static_cast<std::size_t>(n);
        while (left > 0 && i < iov.size()) {  // advance past what the kernel took
            if (left >= iov[i].iov_len) { left -= iov[i].iov_len; ++i; }
            else {
                iov[i].iov_base = static_cast<char*>(iov[i].iov_base) + left;
                iov[i].iov_len -= left;
                left = 0;
            }
        }
    }
    return total;
}

// Zero-copy send: vmsplice maps the source pages into a pipe (references, no copy; checked on
// kernel 6.18: a write to the memory after vmsplice shows in what the pipe delivers), splice moves
// them into the socket's skbs. No copy on the sending side; the pages stay referenced until the
// receiver's kernel frees the skbs (loopback) or the data is ACKed (a NIC). The pipe lives for one
// call; closing it drops any reference it still holds after an error.
class SplicePipe {
public:
    SplicePipe() {
        int p[2];
        if (::pipe2(p, O_CLOEXEC | O_NONBLOCK) != 0) raise_errno(errno, "pipe2");
        r_ = p[0]; w_ = p[1];
        ::fcntl(w_, F_SETPIPE_SZ, kPipeBytes);  // best effort: fs.pipe-max-size may be lower
        int cap = ::fcntl(w_, F_GETPIPE_SZ);
        cap_ = cap > 0 ? static_cast<std::size_t>(cap) : 65536;
    }
    ~SplicePipe() { ::close(r_); ::close(w_); }
    SplicePipe(const SplicePipe&) = delete;
    SplicePipe& operator=(const SplicePipe&) = delete;

    // Send [p, p+len) on fd by reference. Returns false (nothing of this call sent) if the memory
    // cannot be spliced (vmsplice refuses it: e.g. not page-backed), so the caller copies instead.
    bool send(int fd, const char* p, std::size_t len, bool more_after, int timeout_ms) {
        std::size_t off = 0;
        while (off < len) {
            iovec v{const_cast<char*>(p + off), std::min(len - off, cap_)};
            ssize_t n = ::vmsplice(w_, &v, 1, SPLICE_F_NONBLOCK);
            if (n < 0) {
                if (errno == EINTR) continue;
                if (off == 0 && (errno == EFAULT || errno == EINVAL || errno == ENOSYS)) return false;
                raise_errno(errno, "vmsplice");
            }
            off += static_cast<std::size_t>(n);
            unsigned flags = SPLICE_F_MOVE | SPLICE_F_NONBLOCK | ((more_after || off < len) ? SPLICE_F_MORE : 0);
            for (std::size_t left = static_cast<std::size_t>(n); left > 0;) {  // drain the pipe
                ssize_t k = ::splice(r_, nullptr, fd, nullptr, left, flags);
                if (k > 0) { left -= static_cast<std::size_t>(k); continue; }
                if (k == 0) throw PeerClosed("splice: socket closed");
                if (errno == EINTR) continue;
                if (errno == EAGAIN || errno == EWOULDBLOCK) { wait_ready(fd, POLLOUT, timeout_ms, "send"); continue; }
                raise_errno(errno, "splice");
            }
        }
        return true;
    }

private:
    static constexpr int kPipeBytes = 1 << 20;
    int r_ = -1, w_ = -1;
    std::size_t cap_ = 65536;
};

std::size_t send_frame_spliced(int fd, const std::string& header, const std::vector<Segment>& segs, int timeout_ms) {
    std::size_t last = segs.size();
    while (last > 0 && segs[last - 1].second == 0) --last;
    // The header is copied (it lives in a std::string freed on return); MSG_MORE keeps it in the
    // same skb as the first pages.
    std::size_t total = send_frame_nogil(fd, header, {}, timeout_ms, last > 0 ? MSG_MORE : 0);
    SplicePipe pipe;
    for (std::size_t i = 0; i < last; ++i) {
        const auto& s = segs[i];
        if (s.second == 0) continue;
        const char* p = reinterpret_cast<const char*>(s.first);
        if (!pipe.send(fd, p, s.second, i + 1 < last, timeout_ms))
            send_frame_nogil(fd, std::string(), {s}, timeout_ms, i + 1 < last ? MSG_MORE : 0);
        total += s.second;
    }
    return total;
}

// Raises SO_RCVLOWAT for the waits of one call, and puts it back to 1 (the default) after, so the
// caller's next small read (a 13-byte frame header) is not held back waiting for bytes that never come.
class RcvLowat {
public:
    explicit RcvLowat(int fd) : fd_(fd) {}
    ~RcvLowat() { if (cur_ != 1) set(1); }
    void at_most(std::size_t remaining) {  // never above what is still due, or the last wait never ends
        int want = static_cast<int>(std::min<std::size_t>(remaining, kLowat));
        if (want > 0 && want != cur_) set(want);
    }
private:
    void set(int v) { if (::setsockopt(fd_, SOL_SOCKET, SO_RCVLOWAT, &v, sizeof v) == 0) cur_ = v; }
    int fd_, cur_ = 1;
};

std::size_t recv_segments_nogil(int fd, const std::vector<Segment>& segs, int timeout_ms, XXH3_state_t* h) {
    std::size_t total = 0, due = 0;
    for (const auto& s : segs) due += s.second;
    RcvLowat lowat(fd);
    for (const auto& s : segs) {
        char* p = reinterpret_cast<char*>(s.first);
        std::size_t left = s.second;
        while (left > 0) {
            std::size_t want = h ? std::min(left, kHashChunk) : left;
            ssize_t n = ::recv(fd, p, want, 0);
            if (n > 0) {
                if (h) RLSYNC_XXH3_UPDATE(h, p, static_cast<std::size_t>(n));
                p += n;
                left -= static_cast<std::size_t>(n);
                total += static_cast<std::size_t>(n);
                continue;
            }
            if (n == 0) throw PeerClosed("peer closed the connection mid-unit (" + std::to_string(total) + " bytes in)");
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) {
                lowat.at_most(due - total);
                wait_ready(fd, POLLIN, timeout_ms, "recv");
                continue;
            }
            raise_errno(errno, "recv");
        }
    }
    return total;
}

// Same host (the `shm` transport): copy each (remote address in `pid`, local address, length) piece
// out of the source process with process_vm_readv, kHashChunk at a time, hashing each chunk while it
// is hot in L2 (one pass over memory, as recv_segments). Any failure raises OSError with errno.
std::size_t read_process_nogil(int pid, const std::vector<std::tuple<std::uintptr_t, std::uintptr_t, std::size_t>>& pieces,
                               XXH3_state_t* h) {
    std::size_t total = 0;
    for (const auto& [remote, local, len] : pieces) {
        std::size_t done = 0;
        while (done < len) {
            std::size_t want = std::min(len - done, kHashChunk);
            iovec l{reinterpret_cast<void*>(local + done), want}, r{reinterpret_cast<void*>(remote + done), want};
            ssize_t n = ::process_vm_readv(pid, &l, 1, &r, 1, 0);
            if (n < 0) {
                if (errno == EINTR) continue;
                throw SysError(errno, "process_vm_readv from pid " + std::to_string(pid));
            }
            if (n == 0) throw SysError(EIO, "process_vm_readv from pid " + std::to_string(pid) + " made no progress");
            if (h) RLSYNC_XXH3_UPDATE(h, reinterpret_cast<const void*>(local + done), static_cast<std::size_t>(n));
            done += static_cast<std::size_t>(n);
        }
        total += len;
    }
    return total;
}

// Delta frames (hub/delta.py): out = base XOR unshuffle_k(x), where x holds byte j of every k-byte
// element in its j-th plane (x[j*m + i], m = n / k). One pass, in blocks that are hashed while hot
// (xxh3-64 of out: the unit checksum) when hs is given. base may be out (a chain applied in place).
template <typename W, int K>
void unshuffle_xor_block(const std::uint8_t* base, const std::uint8_t* x, std::uint8_t* out, std::size_t m,
                         std::size_t i0, std::size_t i1) {
    for (std::size_t i = i0; i < i1; ++i) {
        W d = 0, b;
        for (int j = 0; j < K; ++j) d |= static_cast<W>(x[j * m + i]) << (8 * j);  // little-endian element
        std::memcpy(&b, base + i * K, K);
        b ^= d;
        std::memcpy(out + i * K, &b, K);
    }
}

void unshuffle_xor_nogil(const std::uint8_t* base, const std::uint8_t* x, std::uint8_t* out, std::size_t n, int k,
                         XXH3_state_t* hs) {
    const std::size_t m = n / k, block = 16384;
    for (std::size_t i0 = 0; i0 < m; i0 += block) {
        const std::size_t i1 = std::min(m, i0 + block);
        switch (k) {
            case 1: unshuffle_xor_block<std::uint8_t, 1>(base, x, out, m, i0, i1); break;
            case 2: unshuffle_xor_block<std::uint16_t, 2>(base, x, out, m, i0, i1); break;
            case 4: unshuffle_xor_block<std::uint32_t, 4>(base, x, out, m, i0, i1); break;
            default: unshuffle_xor_block<std::uint64_t, 8>(base, x, out, m, i0, i1); break;
        }
        if (hs) RLSYNC_XXH3_UPDATE(hs, out + i0 * k, (i1 - i0) * k);
    }
}

struct HashState {
    XXH3_state_t* s = XXH3_createState();
    HashState() { if (!s) throw std::bad_alloc(); XXH3_64bits_reset(s); }
    ~HashState() { XXH3_freeState(s); }
};

}  // namespace

PYBIND11_MODULE(_engine, m) {
    m.doc() = "rlsync native TCP data plane: GIL-free scatter/gather socket I/O with fused xxh3-64.";
    // Python-side types: the generic data-plane code already maps ConnectionError/TimeoutError/OSError
    // to rlsync.hub.errors.TransferError, so these drop into it unchanged.
    py::register_exception<PeerClosed>(m, "PeerClosedError", PyExc_ConnectionError);
    py::register_exception<Timeout>(m, "PeerTimeoutError", PyExc_TimeoutError);
    py::register_exception_translator([](std::exception_ptr p) {
        try {
            if (p) std::rethrow_exception(p);
        } catch (const SysError& e) {
            PyErr_SetObject(PyExc_OSError, py::make_tuple(e.err, e.what()).ptr());
        }
    });

    m.def("send_frame", [](int fd, py::bytes header, const std::vector<Segment>& segs, int timeout_ms, bool zero_copy) {
        std::string head = header;  // copied while we hold the GIL
        py::gil_scoped_release nogil;
        return zero_copy ? send_frame_spliced(fd, head, segs, timeout_ms) : send_frame_nogil(fd, head, segs, timeout_ms);
    }, py::arg("fd"), py::arg("header"), py::arg("segments"), py::arg("timeout_ms"), py::arg("zero_copy") = false,
    "Send header then every (address, length) segment on fd; returns bytes sent. The caller keeps "
    "the memory alive and unchanged for the call; with zero_copy=True (pages spliced by reference), "
    "until the peer confirms it has received every byte.");

    m.def("recv_segments", [](int fd, const std::vector<Segment>& segs, int timeout_ms, bool checksum) -> py::object {
        std::size_t n;
        std::uint64_t digest = 0;
        {
            HashState hs;
            py::gil_scoped_release nogil;
            n = recv_segments_nogil(fd, segs, timeout_ms, checksum ? hs.s : nullptr);
            if (checksum) digest = XXH3_64bits_digest(hs.s);
        }
        (void)n;
        if (!checksum) return py::none();
        return py::int_(digest);
    }, py::arg("fd"), py::arg("segments"), py::arg("timeout_ms"), py::arg("checksum") = true,
    "Fill every (address, length) segment from fd in order; returns the xxh3-64 of the bytes "
    "(the manifest's unit checksum) when checksum=True, else None.");

    m.def("read_process", [](int pid, const std::vector<std::tuple<std::uintptr_t, std::uintptr_t, std::size_t>>& pieces,
                             bool checksum) -> py::object {
        std::uint64_t digest = 0;
        {
            HashState hs;
            py::gil_scoped_release nogil;
            read_process_nogil(pid, pieces, checksum ? hs.s : nullptr);
            if (checksum) digest = XXH3_64bits_digest(hs.s);
        }
        if (!checksum) return py::none();
        return py::int_(digest);
    }, py::arg("pid"), py::arg("pieces"), py::arg("checksum") = true,
    "Copy every (remote address in pid, local address, length) piece out of process pid "
    "(process_vm_readv) with the GIL released; returns the xxh3-64 of the bytes when checksum=True.");

    m.def("xxh3_64", [](const std::vector<Segment>& segs) {
        HashState hs;
        py::gil_scoped_release nogil;
        for (const auto& s : segs) RLSYNC_XXH3_UPDATE(hs.s, reinterpret_cast<const void*>(s.first), s.second);
        return static_cast<std::uint64_t>(XXH3_64bits_digest(hs.s));
    }, py::arg("segments"), "xxh3-64 over (address, length) segments, as rlsync.hub.manifest.unit_checksum.");

    m.def("unshuffle_xor", [](std::uintptr_t base, std::uintptr_t x, std::uintptr_t out, std::size_t n, int k,
                              bool checksum) -> py::object {
        if (k != 1 && k != 2 && k != 4 && k != 8) throw std::invalid_argument("unshuffle_xor: k must be 1, 2, 4 or 8");
        if (n % k) throw std::invalid_argument("unshuffle_xor: n must be a multiple of k");
        std::uint64_t digest = 0;
        {
            HashState hs;
            py::gil_scoped_release nogil;
            unshuffle_xor_nogil(reinterpret_cast<const std::uint8_t*>(base), reinterpret_cast<const std::uint8_t*>(x),
                                reinterpret_cast<std::uint8_t*>(out), n, k, checksum ? hs.s : nullptr);
            if (checksum) digest = XXH3_64bits_digest(hs.s);
        }
        if (!checksum) return py::none();
        return py::int_(digest);
    }, py::arg("base"), py::arg("x"), py::arg("out"), py::arg("n"), py::arg("k"), py::arg("checksum") = true,
    "out[i*k+j] = base[i*k+j] ^ x[j*(n/k)+i] over n bytes at these addresses (a delta frame's byte-shuffled "
    "XOR, hub/delta.py; base may be out); returns the xxh3-64 of out when checksum=True.");

    m.attr("XXH_VERSION") = XXH_versionNumber();
#ifdef RLSYNC_ENGINE_SOURCES
    m.attr("SOURCES") = RLSYNC_ENGINE_SOURCES;  // digest of csrc/ at build (setup.py): stale builds show
#endif
}
