// The FP8 up projection's epilogue (Fp8ActFwd, gated activations): pre in bf16 (TMA stores, as
// Sm90ActForwardAux writes it) and h = act(pre) either in bf16 (Sm90ActForwardAux's own store)
// or, where the call asks for it, as its e4m3 copy by 1 x 128 blocks along the row with one
// fp32 scale per block (docs/fp8.md, "Formats"): the down projection's operand, with no bf16 h
// and no pass over pre (act_quantize_fp8_1x128) between the two GEMMs.
//
// A 1 x 128 block of h is 256 columns of pre, two 128-wide tiles: the widest FP8 tile (a
// warpgroup's 64 x 128 slice, its accumulator and two promotion temporaries) sees 64 h columns.
// So the kernel runs 1 x 2 clusters along n (tiles 2j and 2j + 1 of one row of tiles, one block
// of h, at the same time; A multicast to both) and the two CTAs exchange each row's amax:
//   1. each thread holds its h values of the whole tile (the bf16 values as floats, 32 a
//      thread) through the subtiles; at the tile's end it takes each of its rows' amax, then
//      its quad's (the four threads of a quad hold a row's columns, WGMMA's layout);
//   2. the quad's first thread stores the row's amax into the peer CTA's shared memory
//      (st.async, distributed shared memory), which completes 4 bytes of a transaction on the
//      peer's mbarrier for that tile; one thread sets its own mbarrier's expected bytes (one
//      float per row of the tile);
//   3. the quad's first thread waits on its mbarrier, reads the peer's amax and the quad
//      quantizes with the max of the two (scale and quotient as quantize_fp8_1x128: the bits
//      of act_quantize_fp8_1x128 over the bf16 pre);
//   4. a 4 x 4 byte transpose inside the quad gives each thread 16 consecutive bytes of the
//      row: one 16-byte store a row; the even tile's quads write the block's scale.
// Two mbarriers and amax buffers, used by alternate tiles: the peer sends tile t + 2's amax only
// after it has received this CTA's for tile t + 1, which this CTA sends after reading tile t's.
// Both CTAs of a cluster take the same tiles in the same order (CUTLASS's grouped scheduler
// hands out cluster tiles), so neither waits for a tile the other does not run. A tile past
// the problem's n (an odd count of n tiles) sends zeros and writes nothing.
#pragma once

#include <cute/arch/cluster_sm90.hpp>
#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>

#include "../fp8_block_math.cuh"
#include "../kernel_registry.h"  // Fp8RowsOutput
#include "act_forward_epilogue.cuh"

namespace cute_moe::detail {

namespace fp8_h {

struct Arguments : act_epilogue::ForwardArguments {
  Fp8RowsOutput h_fp8;  // q null: h in bf16 (ForwardArguments::h), as Sm90ActForwardAux
};

// This thread's 32-bit value into the peer CTA's shared memory at `local` (the same offset
// there), completing 4 bytes of the peer's transaction barrier at `local_bar`'s offset.
CUTLASS_DEVICE void send_to_peer(float const* local, uint64_t const* local_bar, float value, uint32_t peer) {
  const uint32_t addr = cute::set_block_rank(cute::cast_smem_ptr_to_uint(local), peer);
  const uint32_t bar = cute::set_block_rank(cute::cast_smem_ptr_to_uint(local_bar), peer);
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];" ::"r"(addr),
               "r"(__float_as_uint(value)), "r"(bar)
               : "memory");
}

// The quad's 4 x 4 words: word j of lane p (bytes: h columns 4 (4 j + i) + p of the quad's 64)
// -> word k of lane q (bytes p: h column 16 q + 4 k + p), so each lane holds 16 consecutive
// bytes. Lane q first gathers word q of every lane (R_p), then transposes their bytes.
CUTLASS_DEVICE void quad_transpose(uint32_t (&w)[4]) {
  const int q = threadIdx.x & 3;
  uint32_t r[4];
  CUTLASS_PRAGMA_UNROLL
  for (int x = 0; x < 4; ++x) {  // from lane q ^ x, which sends its word (q ^ x) ^ x = q
    const int j = q ^ x;
    const uint32_t send = j == 0 ? w[0] : j == 1 ? w[1] : j == 2 ? w[2] : w[3];
    r[x] = x == 0 ? send : __shfl_xor_sync(0xffffffffu, send, x);
  }
  uint32_t rp[4];  // R_p by the sending lane p = q ^ x
  CUTLASS_PRAGMA_UNROLL
  for (int p = 0; p < 4; ++p) {
    const int x = p ^ q;
    rp[p] = x == 0 ? r[0] : x == 1 ? r[1] : x == 2 ? r[2] : r[3];
  }
  const uint32_t lo01 = __byte_perm(rp[0], rp[1], 0x5140), lo23 = __byte_perm(rp[2], rp[3], 0x5140);
  const uint32_t hi01 = __byte_perm(rp[0], rp[1], 0x7362), hi23 = __byte_perm(rp[2], rp[3], 0x7362);
  w[0] = __byte_perm(lo01, lo23, 0x5410);
  w[1] = __byte_perm(lo01, lo23, 0x7632);
  w[2] = __byte_perm(hi01, hi23, 0x5410);
  w[3] = __byte_perm(hi01, hi23, 0x7632);
}

}  // namespace fp8_h

template <class Activation, class EpiTile, int kStages, int kTileM, int kTileN>
struct Sm90ActForwardFp8H : Sm90ActForwardAux<Activation, EpiTile, kStages> {
  static_assert(Activation::kGated, "the e4m3 h copy is for the gated activations (pairs of pre columns)");
  static_assert(kTileN == fp8_math::kBlock, "a 1 x 128 block of h: two tiles of 128 pre columns");
  using Base = Sm90ActForwardAux<Activation, EpiTile, kStages>;
  using Arguments = fp8_h::Arguments;
  struct SharedStorage {
    typename Base::SharedStorage base;
    alignas(8) uint64_t full[2];    // tile t's peer amax arrived (t & 1)
    float peer_amax[2][kTileM];     // the peer's amax of each row of the tile
  };
  struct Params {
    typename Base::Params base;
    Fp8RowsOutput h_fp8;
    const int32_t* offs;
  };
  template <class ProblemShape>
  static Params to_underlying_arguments(ProblemShape const& shape, Arguments const& a, void* workspace) {
    return {Base::to_underlying_arguments(shape, a, workspace), a.h_fp8, a.offs};
  }

  Params const* fp8_params = nullptr;
  SharedStorage* fp8_storage = nullptr;
  int tiles = 0;  // tiles this thread has run the epilogue of (the barriers' phases)

  CUTLASS_HOST_DEVICE Sm90ActForwardFp8H() {}
  // Made once per kernel by every thread, before the kernel's cluster-wide sync: the barriers
  // are initialized there, visible to the peer's st.async after that sync.
  CUTLASS_HOST_DEVICE Sm90ActForwardFp8H(Params const& p, SharedStorage const& s)
      : Base(p.base, s.base), fp8_params(&p), fp8_storage(const_cast<SharedStorage*>(&s)) {
#if defined(__CUDA_ARCH__)
    if (p.h_fp8.q != nullptr && threadIdx.x == 0) {
      cutlass::arch::ClusterBarrier::init(&fp8_storage->full[0], 1);
      cutlass::arch::ClusterBarrier::init(&fp8_storage->full[1], 1);
      cutlass::arch::fence_barrier_init();
    }
#endif
  }

  template <class BaseCallbacks, class CTensor, int kRowSlots, int kPerSubtile, int kSubtiles>
  struct ConsumerStoreCallbacks : BaseCallbacks {
    static constexpr int kHPerSubtile = kPerSubtile / 2;
    bool fp8;               // the e4m3 copy instead of bf16 h (uniform)
    CTensor tCcD;           // (CPY,CPY_M,CPY_N,EPI_M,EPI_N) from the thread's first element
    SharedStorage* storage;
    int tile;               // this CTA's tile count: the buffer and the barrier's phase
    uint8_t* q_row;         // the quad's first h column of the tile, in the thread's first row
    int64_t ld_q;
    float* scale_row;       // the thread's first row's scale of the tile's block, or null (odd tile)
    int64_t ld_scale;
    int first_m;            // the thread's first row within the tile
    int rows_left;          // the group's rows from the thread's first
    int cols_left;          // pre columns from the thread's first element
    int h_cols_left;        // h columns from the tile's first
    // the bf16 h values, widened. (Not a cutlass::Array of bf16: its elements are proxies into
    // packed storage, and one assigned from another Array's element copied the proxy, not the
    // value, leaving zeros.)
    float held[kSubtiles][kHPerSubtile];

    CUTLASS_DEVICE ConsumerStoreCallbacks(BaseCallbacks base, bool fp8, CTensor t, SharedStorage* storage, int tile)
        : BaseCallbacks(base), fp8(fp8), tCcD(t), storage(storage), tile(tile) {}

    template <typename ElementAccumulator, typename ElementInput, int FragmentSize>
    CUTLASS_DEVICE auto visit(cutlass::Array<ElementAccumulator, FragmentSize> const& acc, int epi_v, int epi_m,
                              int epi_n, cutlass::Array<ElementInput, FragmentSize> const& frg_pre) {
      auto out = BaseCallbacks::visit(acc, epi_v, epi_m, epi_n, frg_pre);
      // the h values the base computed for h's store, kept for the copy
      constexpr int kSubM = decltype(cute::size<3>(CTensor{}))::value;
      const int sub = epi_n * kSubM + epi_m;
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < FragmentSize / 2; ++i) {
        held[sub][epi_v * (FragmentSize / 2) + i] = float(this->h_store.values[epi_v * (FragmentSize / 2) + i]);
      }
      return out;
    }

    CUTLASS_DEVICE void postreduce(int epi_m, int epi_n, int store_iteration, bool issue_smem_store) {
      if (!fp8) return BaseCallbacks::postreduce(epi_m, epi_n, store_iteration, issue_smem_store);
      if (issue_smem_store) this->pre_store.to_smem(epi_m, epi_n, store_iteration);
    }
    CUTLASS_DEVICE void tma_store(int epi_m, int epi_n, int store_iteration, bool issue_tma_store) {
      if (!fp8) return BaseCallbacks::tma_store(epi_m, epi_n, store_iteration, issue_tma_store);
      this->pre_store.to_gmem(epi_m, epi_n, store_iteration, issue_tma_store);
    }

    CUTLASS_DEVICE void end() {
      using namespace cute;
      if (!fp8) return;
      constexpr int kSubM = decltype(size<3>(CTensor{}))::value;
      const int lane_q = threadIdx.x & 3;
      const bool leader = lane_q == 0;
      const int buf = tile & 1;
      // each of the thread's rows' amax over its h values inside the problem, then the quad's
      float amax[kRowSlots];
      bool mine[kRowSlots];
      CUTLASS_PRAGMA_UNROLL
      for (int s = 0; s < kRowSlots; ++s) amax[s] = 0.0f, mine[s] = false;
      CUTLASS_PRAGMA_UNROLL
      for (int sub = 0; sub < kSubtiles; ++sub) {
        auto coords = tCcD(_, _, _, sub % kSubM, sub / kSubM);
        CUTLASS_PRAGMA_UNROLL
        for (int j = 0; j < kHPerSubtile; ++j) {
          const int m = get<0>(coords(2 * j)), n = get<1>(coords(2 * j));
          const int slot = m / 8;
          const float v = n < cols_left ? fabsf(held[sub][j]) : 0.0f;
          CUTLASS_PRAGMA_UNROLL
          for (int s = 0; s < kRowSlots; ++s) {
            if (s == slot) amax[s] = fp8_math::nan_max(amax[s], v), mine[s] = true;
          }
        }
      }
      const uint32_t peer = cute::block_rank_in_cluster() ^ 1u;
      CUTLASS_PRAGMA_UNROLL
      for (int s = 0; s < kRowSlots; ++s) {
        if (!mine[s]) continue;
        float a = amax[s];
        a = fp8_math::nan_max(a, __shfl_xor_sync(0xffffffffu, a, 1));
        a = fp8_math::nan_max(a, __shfl_xor_sync(0xffffffffu, a, 2));
        amax[s] = a;
        if (leader) fp8_h::send_to_peer(&storage->peer_amax[buf][first_m + 8 * s], &storage->full[buf], a, peer);
      }
      if (first_m == 0 && lane_q == 0) {  // the tile's first row's thread: one arrival per phase
        cutlass::arch::ClusterTransactionBarrier::arrive_and_expect_tx(&storage->full[buf], kTileM * sizeof(float));
      }
      if (leader) cutlass::arch::ClusterBarrier::wait(&storage->full[buf], (tile >> 1) & 1);
      // the block's amax and scale of each row: the peer's by the leader, to its quad
      float scale[kRowSlots], reciprocal[kRowSlots];
      CUTLASS_PRAGMA_UNROLL
      for (int s = 0; s < kRowSlots; ++s) {
        scale[s] = reciprocal[s] = 1.0f;
        if (!mine[s]) continue;
        float a = amax[s];
        if (leader) a = fp8_math::nan_max(a, storage->peer_amax[buf][first_m + 8 * s]);
        a = __shfl_sync(0xffffffffu, a, threadIdx.x & ~3 & 31);
        scale[s] = fp8_math::block_scale(a);
        reciprocal[s] = 1.0f / scale[s];
      }
      // the quotients by row and 4-column chunk c (the thread's h column 4 c + lane_q of the
      // tile), then word w of a row: chunks 4 w .. 4 w + 3
      constexpr int kChunks = kTileN / 8;
      constexpr int kWords = kChunks / 4;
      static_assert(kWords == 4, "the quad transpose moves 4 x 4 words");
      float quotient[kRowSlots][kChunks];
      CUTLASS_PRAGMA_UNROLL
      for (int sub = 0; sub < kSubtiles; ++sub) {
        auto coords = tCcD(_, _, _, sub % kSubM, sub / kSubM);
        CUTLASS_PRAGMA_UNROLL
        for (int j = 0; j < kHPerSubtile; ++j) {
          const int m = get<0>(coords(2 * j)), n = get<1>(coords(2 * j));
          const int slot = m / 8, c = n / 8;  // pre columns 8 c + 2 lane_q, + 1 from the tile's first
          float sc = 1.0f, rc = 1.0f;
          CUTLASS_PRAGMA_UNROLL
          for (int s = 0; s < kRowSlots; ++s) sc = s == slot ? scale[s] : sc, rc = s == slot ? reciprocal[s] : rc;
          const fp8_math::ScaleDivisor div{sc, rc};
          const float x = held[sub][j];
          const float qv = fp8_math::ScaleDivisor::fast_for(sc) ? div.fast(x) : div.exact(x);
          CUTLASS_PRAGMA_UNROLL
          for (int s = 0; s < kRowSlots; ++s) {
            CUTLASS_PRAGMA_UNROLL
            for (int cc = 0; cc < kChunks; ++cc) {
              if (s == slot && cc == c) quotient[s][cc] = qv;
            }
          }
        }
      }
      uint32_t words[kRowSlots][kWords];
      CUTLASS_PRAGMA_UNROLL
      for (int s = 0; s < kRowSlots; ++s) {
        if (!mine[s]) continue;
        CUTLASS_PRAGMA_UNROLL
        for (int w = 0; w < kWords; ++w) {
          words[s][w] = fp8_math::e4m3x2(quotient[s][4 * w], quotient[s][4 * w + 1]) |
                        fp8_math::e4m3x2(quotient[s][4 * w + 2], quotient[s][4 * w + 3]) << 16;
        }
      }
      CUTLASS_PRAGMA_UNROLL
      for (int s = 0; s < kRowSlots; ++s) {
        if (!mine[s]) continue;
        fp8_h::quad_transpose(words[s]);
        const int row = 8 * s;  // from the thread's first
        if (row < rows_left && 16 * lane_q < h_cols_left) {
          uint4 v = make_uint4(words[s][0], words[s][1], words[s][2], words[s][3]);
          __stcg(reinterpret_cast<uint4*>(q_row + int64_t(row) * ld_q + 16 * lane_q), v);
        }
        if (scale_row != nullptr && leader && row < rows_left && h_cols_left > 0) {
          scale_row[int64_t(row) * ld_scale] = scale[s];
        }
      }
    }
  };

  template <bool ReferenceSrc, class... Args>
  CUTLASS_DEVICE auto get_consumer_store_callbacks(
      cutlass::epilogue::fusion::detail::ConsumerStoreArgs<Args...> const& args) {
    using namespace cute;
    auto base = Base::template get_consumer_store_callbacks<ReferenceSrc>(args);
    constexpr int kRowSlots = kTileM / 8;
    constexpr int kPerSubtile = decltype(size(args.tCcD(_, _, _, 0, 0)))::value;
    constexpr int kSubtiles = decltype(size<3>(args.tCcD) * size<4>(args.tCcD))::value;
    using Callbacks = ConsumerStoreCallbacks<decltype(base), decltype(args.tCcD), kRowSlots, kPerSubtile, kSubtiles>;
    const Fp8RowsOutput& out = fp8_params->h_fp8;
    Callbacks cb(base, out.q != nullptr, args.tCcD, fp8_storage, tiles);
    if (out.q == nullptr) return cb;
    ++tiles;
    const int m = get<0>(args.tile_coord_mnkl), n = get<1>(args.tile_coord_mnkl), l = get<3>(args.tile_coord_mnkl);
    const int rows_left = get<0>(args.residue_tCcD), cols_left = get<1>(args.residue_tCcD);
    const int64_t m_first = int64_t(get<0>(args.problem_shape_mnkl)) - rows_left;  // in the group
    const int64_t row0 = (l == 0 ? 0 : int64_t(fp8_params->offs[l - 1])) + m_first;
    const int64_t n_total = get<1>(args.problem_shape_mnkl);
    const int64_t tile_n0 = int64_t(n) * kTileN;
    const int64_t tile_h0 = tile_n0 / 2;
    cb.q_row = static_cast<uint8_t*>(out.q) + row0 * out.ld_q + tile_h0;
    cb.ld_q = out.ld_q;
    cb.scale_row = n % 2 == 0 ? out.scale + row0 * out.ld_scale + tile_h0 / fp8_math::kBlock : nullptr;
    cb.ld_scale = out.ld_scale;
    cb.first_m = int(m_first - int64_t(m) * kTileM);
    cb.rows_left = rows_left;
    cb.cols_left = cols_left;
    cb.h_cols_left = int((n_total - tile_n0) / 2);
    return cb;
  }
};

}  // namespace cute_moe::detail
