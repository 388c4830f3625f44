// GIN (GPU-initiated networking) for cuco's kernels: one type, `cuco::Gin`, with the part
// of `ncclGin`'s interface the templates use (put with a signal, signal, waitSignal, the
// signal shadows, flush, the world barrier), over either
//
//  * NCCL's own GIN (ranks on different hosts with a GIN-capable network), or
//  * an emulated GIN in an emulated world (W ranks as W processes sharing one GPU,
//    cuco.runtime.emulated), where NCCL's GIN cannot run (it needs GDRCopy and RDMA).
//
// The emulated GIN behaves like a NIC, at GIN's weakest promises: a put only writes a
// descriptor into this rank's queue; a proxy CTA on a stream of its own (`gin_proxy`) takes
// published descriptors out of order (a random one of the first few), after a random delay,
// copies the bytes into the peer's window through CUDA IPC and then adds to the peer's
// signal. So a kernel that relies on more than GIN guarantees fails: one that reuses a
// put's source before `flush` sends the new bytes; one that reads data before its signal
// reads poison; one that counts on puts landing in issue order sees them reordered.
// Signals are weak (ncclGin_SignalInc, the one signal type NCCL 2.28.9 has, is treated as
// 2.32's ncclGin_WeakSignalInc): an increment says its own put landed, nothing of earlier ones.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cuda/atomic>
#include <nccl.h>
#include <nccl_device.h>

#include <cuco/arena/emulated.cuh>

namespace cuco {

// One queued put (or bare signal): layout shared with cuco/runtime/emulated.py.
struct EmuGinDesc {
  unsigned long long seq;   // slot + 1 once published (release)
  unsigned long long done;  // slot + 1 once the proxy completed it
  int peer;
  int signal;               // -1: none
  int cta;                  // the issuing CTA (flush waits for its own CTA's puts)
  int pad;
  unsigned long long dst_off, src_off, bytes;
};

enum EmuGinCtl { kGinHead = 0, kGinTail = 1, kGinStop = 2 };

// An emulated world's GIN state for one rank (layout shared with cuco/runtime/emulated.py).
struct EmuGin {
  EmuComm comm;                          // rank, size and the world barrier's flags
  uint64_t* signals[kEmuMaxRanks];       // rank r's signal array, as mapped here (IPC)
  uint64_t* shadows;                     // this rank's signal shadows
  EmuGinDesc* queue;                     // this rank's descriptor ring
  unsigned long long* ctl;               // [head, tail, stop]
  unsigned long long* issued;            // per CTA: puts issued
  unsigned long long* completed;         // per CTA: puts whose source the proxy consumed
  int n_signals;
  int capacity;                          // ring slots
  int window;                            // the proxy picks among this many published ones
  int max_delay_ns;                      // and waits up to this long before each
};

template <class A>
using SysRef = cuda::atomic_ref<A, cuda::thread_scope_system>;

__device__ __forceinline__ int signal_of(ncclGin_None) { return -1; }
__device__ __forceinline__ int signal_of(ncclGin_SignalInc s) { return (int)s.signal; }

// The issuing side of the emulated GIN: one thread of the coop writes the descriptor.
__device__ __forceinline__ void emu_gin_enqueue(const EmuGin& g, int peer, size_t dst_off,
                                                size_t src_off, size_t bytes, int signal) {
  __threadfence_system();  // the coop's writes of the source (ordered by its sync) first
  const unsigned long long slot = atomicAdd(&g.ctl[kGinHead], 1ull);
  SysRef<unsigned long long> tail(g.ctl[kGinTail]);
  while (slot >= tail.load(cuda::memory_order_acquire) + (unsigned long long)g.capacity) {
  }
  EmuGinDesc& d = g.queue[slot % g.capacity];
  d.peer = peer;
  d.signal = signal;
  d.cta = blockIdx.x;
  d.dst_off = dst_off;
  d.src_off = src_off;
  d.bytes = bytes;
  atomicAdd(&g.issued[blockIdx.x], 1ull);
  SysRef<unsigned long long>(d.seq).store(slot + 1, cuda::memory_order_release);
}

struct Gin {
  const ncclDevComm* comm;
  ncclWindow_t win;
  int context;

  __device__ __forceinline__ bool emulated() const { return is_emulated(win); }
  __device__ __forceinline__ const EmuGin& emu() const { return *reinterpret_cast<const EmuGin*>(comm); }
  __device__ __forceinline__ ncclGin real() const { return ncclGin{*comm, context}; }

  __device__ __forceinline__ int rank() const { return emulated() ? emu().comm.rank : comm->rank; }
  __device__ __forceinline__ int size() const { return emulated() ? emu().comm.size : comm->nRanks; }
  // The world team (what NCCL's put and signal take; the emulated GIN is one world).
  __device__ __forceinline__ ncclTeam world() const {
    return emulated() ? ncclTeam{emu().comm.size, emu().comm.rank, 1} : ncclTeamWorld(*comm);
  }
  __device__ __forceinline__ char* local(size_t off) const {
    return emulated() ? emu_window(win).base[emu().comm.rank] + off : (char*)ncclGetLocalPointer(win, off);
  }

  // ncclGin::put of `bytes` from this rank's srcWnd + srcOff to peer's dstWnd + dstOff;
  // `remote` (ncclGin_None or a signal increment) lands after the bytes.
  template <class RemoteAction, class Coop>
  __device__ __forceinline__ void put(ncclTeam team, int peer, ncclWindow_t dstWnd, size_t dstOff,
                                      ncclWindow_t srcWnd, size_t srcOff, size_t bytes, RemoteAction remote,
                                      ncclGin_None local, Coop coop) const {
    if (!emulated()) {
      real().put(team, peer, dstWnd, dstOff, srcWnd, srcOff, bytes, remote, local, coop);
      return;
    }
    coop.sync();
    if (coop.thread_rank() == 0) emu_gin_enqueue(emu(), peer, dstOff, srcOff, bytes, signal_of(remote));
    coop.sync();
  }

  template <class RemoteAction, class Coop>
  __device__ __forceinline__ void signal(ncclTeam team, int peer, RemoteAction remote, Coop coop) const {
    if (!emulated()) {
      real().signal(team, peer, remote, coop);
      return;
    }
    coop.sync();
    if (coop.thread_rank() == 0) emu_gin_enqueue(emu(), peer, 0, 0, 0, signal_of(remote));
    coop.sync();
  }

  __device__ __forceinline__ uint64_t* emu_signal(int id) const { return emu().signals[emu().comm.rank] + id; }

  // Until this rank's signal `id` reaches `least` (acquire).
  template <class Coop>
  __device__ __forceinline__ void waitSignal(Coop coop, ncclGinSignal_t id, uint64_t least) const {
    if (!emulated()) {
      real().waitSignal(coop, id, least);
      return;
    }
    coop.sync();
    if (coop.thread_rank() == 0) {
      SysRef<uint64_t> s(*emu_signal(id));
      while (s.load(cuda::memory_order_acquire) < least) {
      }
    }
    coop.sync();
  }

  // The shadow of signal `id` is what this rank expects it to reach: raised by the
  // increments a call expects, waited for with waitSignalMeetShadow. Targets are then
  // relative to the call, never to an epoch or to the signal's history.
  __device__ __forceinline__ void increaseSignalShadow(ncclGinSignal_t id, uint64_t delta) const {
    if (!emulated()) {
      real().increaseSignalShadow(id, delta);
      return;
    }
    emu().shadows[id] += delta;
  }

  template <class Coop>
  __device__ __forceinline__ void waitSignalMeetShadow(Coop coop, ncclGinSignal_t id) const {
    if (!emulated()) {
      real().waitSignalMeetShadow(coop, id);
      return;
    }
    coop.sync();
    if (coop.thread_rank() == 0) {
      const uint64_t least = *(volatile uint64_t*)(emu().shadows + id);
      SysRef<uint64_t> s(*emu_signal(id));
      while (s.load(cuda::memory_order_acquire) < least) {
      }
    }
    coop.sync();
  }

  // Every put this CTA issued so far has consumed its source (GIN's flush: only then may a
  // source be overwritten). It says nothing of the bytes having landed.
  template <class Coop>
  __device__ __forceinline__ void flush(Coop coop) const {
    if (!emulated()) {
      real().flush(coop);
      return;
    }
    coop.sync();
    if (coop.thread_rank() == 0) {
      const EmuGin& g = emu();
      const unsigned long long n = SysRef<unsigned long long>(g.issued[blockIdx.x]).load(cuda::memory_order_relaxed);
      SysRef<unsigned long long> c(g.completed[blockIdx.x]);
      while (c.load(cuda::memory_order_acquire) < n) {
      }
    }
    coop.sync();
  }

  // The world barrier of CTA `index` (every thread of the CTA calls it).
  __device__ __forceinline__ void barrier(int index) const {
    if (emulated()) {
      emu_barrier(emu().comm, index);
      return;
    }
    ncclBarrierSession<ncclCoopCta> bar{ncclCoopCta(), ncclTeamTagWorld(), real(), (uint32_t)index};
    bar.sync(ncclCoopCta(), cuda::memory_order_acq_rel, ncclGinFenceLevel::Relaxed);
  }
};

// ---- the emulated NIC ----------------------------------------------------------------
__device__ __forceinline__ uint32_t gin_rand(uint64_t& s) {
  s ^= s << 13;
  s ^= s >> 7;
  s ^= s << 17;
  return (uint32_t)(s >> 11);
}

// The proxy of one rank, one CTA: drains this rank's descriptor queue until the
// communication kernel is done (the runner sets ctl[stop] after it) and the queue is empty.
// Completion order is random within `window` published descriptors and each waits a random
// delay, so puts land late and out of order, as GIN allows.
__device__ void gin_proxy_body(const EmuGin& g, const EmuWindow& w, uint64_t seed) {
  __shared__ long long pick;  // -1: nothing published; -2: stop
  uint64_t rng = seed * 0x9E3779B97F4A7C15ull + (uint64_t)g.comm.rank * 0xD1B54A32D192ED03ull + 1;
  SysRef<unsigned long long> head(g.ctl[kGinHead]), tail(g.ctl[kGinTail]), stop(g.ctl[kGinStop]);
  for (;;) {
    if (threadIdx.x == 0) {
      const unsigned long long t = tail.load(cuda::memory_order_relaxed);
      const bool stopping = stop.load(cuda::memory_order_acquire) != 0;
      const unsigned long long h = head.load(cuda::memory_order_acquire);
      long long found[32];
      int n = 0;
      for (unsigned long long i = t; i < h && i < t + (unsigned long long)g.window && n < 32; ++i) {
        EmuGinDesc& d = g.queue[i % g.capacity];
        if (SysRef<unsigned long long>(d.seq).load(cuda::memory_order_acquire) == i + 1 && d.done != i + 1)
          found[n++] = (long long)i;
      }
      pick = n ? found[gin_rand(rng) % n] : (stopping && h == t ? -2 : -1);
      if (n && g.max_delay_ns > 0) {
        unsigned wait = gin_rand(rng) % (unsigned)g.max_delay_ns;
        while (wait > 0) {
          const unsigned step = wait < 1000 ? wait : 1000;
          __nanosleep(step);
          wait -= step;
        }
      }
    }
    __syncthreads();
    const long long i = pick;
    if (i == -2) break;
    if (i >= 0) {
      EmuGinDesc& d = g.queue[(unsigned long long)i % g.capacity];
      const char* src = w.base[g.comm.rank] + d.src_off;
      char* dst = w.base[d.peer] + d.dst_off;
      const size_t bytes = d.bytes;
      if (((uintptr_t)src | (uintptr_t)dst | bytes) % 16 == 0) {
        for (size_t b = (size_t)threadIdx.x * 16; b < bytes; b += (size_t)blockDim.x * 16)
          *(uint4*)(dst + b) = *(const uint4*)(src + b);
      } else {
        for (size_t b = threadIdx.x; b < bytes; b += blockDim.x) dst[b] = src[b];
      }
      __syncthreads();
      if (threadIdx.x == 0) {
        __threadfence_system();  // the bytes before the signal and the completion
        if (d.signal >= 0)
          SysRef<uint64_t>(g.signals[d.peer][d.signal]).fetch_add(1, cuda::memory_order_release);
        SysRef<unsigned long long>(g.completed[d.cta]).fetch_add(1, cuda::memory_order_release);
        d.done = (unsigned long long)i + 1;
        unsigned long long t = tail.load(cuda::memory_order_relaxed);
        while (t < head.load(cuda::memory_order_acquire) && g.queue[t % g.capacity].done == t + 1) ++t;
        tail.store(t, cuda::memory_order_release);
      }
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) stop.store(0, cuda::memory_order_relaxed);  // for the next call's proxy
}

}  // namespace cuco
