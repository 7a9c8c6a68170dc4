// Which loop shapes ptxas keeps WGMMAs in flight in (docs/perf-notes.md, session 31). Each
// variant is one kernel of the FP8 mainloop's pattern: two temporaries, each k-tile issued
// into one before the other is waited for (wait_group 1) and promoted into the accumulator.
// scripts/ptxas_wgmma_probe.sh compiles every variant and reports ptxas's C7514 (every WGMMA
// serialized) / C7517 (a wait injected). Not built by CMake; never launched (the descriptors
// are made up): a compile-time probe, to re-check after a CUDA update.
//
//   STOCK      CUTLASS's k-loop: prologue issue, the loop, the tail with both branches
//   PLAIN_TAIL the same loop, the tail only `wait 0; promote`
//   TILE_LOOP  a tile loop around that k-loop, the next tile's first k-tile issued before the
//              epilogue (crosses the tile loop's back edge)
//   FLAT       one loop over all tiles' k-tiles, the epilogue in a branch after a tile's last
//              k-tile, CUTLASS's tail after the loop (what LookAheadCooperativeKernel did)
#include <cstdint>

namespace {

__device__ __forceinline__ void fence(float (&x)[64]) {
  for (int i = 0; i < 64; ++i) asm volatile("" : "+f"(x[i])::"memory");
}

// One k-tile: four m64n128k32 e4m3 WGMMAs into d (scale-d 0 on the first), one commit group.
__device__ __forceinline__ void issue(float (&d)[64], uint64_t desc_a, uint64_t desc_b) {
  fence(d);
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
  for (int kb = 0; kb < 4; ++kb) {
    asm volatile(
        "{\n .reg .pred p;\n setp.ne.b32 p, %66, 0;\n"
        " wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, "
        "%11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, "
        "%53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
          "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "l"(desc_a + kb), "l"(desc_b + kb), "r"(kb));
  }
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
  fence(d);
}
template <int kPending>
__device__ __forceinline__ void wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}
__device__ __forceinline__ void promote(float (&acc)[64], float (&t)[64], float s) {
  fence(t);
  fence(acc);
  for (int i = 0; i < 64; ++i) acc[i] += t[i] * s;
  fence(acc);
}
__device__ __forceinline__ void store(float* out, const float (&acc)[64], int tile) {
  for (int i = 0; i < 64; ++i) out[(tile * 128 + threadIdx.x) * 64 + i] = acc[i];
}

}  // namespace

extern "C" __global__ void probe(float* out, uint64_t a, uint64_t b, int tiles, int k_tiles, const float* s) {
  float acc[64], t0[64], t1[64];
  for (int i = 0; i < 64; ++i) acc[i] = 0.f;
#if defined(STOCK) || defined(PLAIN_TAIL)
  issue(t0, a, b);
  int left = k_tiles - 1;
#pragma unroll 1
  for (; left >= 2; left -= 2) {
    issue(t1, a + left, b); wait<1>(); promote(acc, t0, s[left]);
    issue(t0, a + left + 1, b); wait<1>(); promote(acc, t1, s[left + 1]);
  }
#if defined(STOCK)
  if (left == 1) { issue(t1, a + 1, b); wait<1>(); promote(acc, t0, s[1]); wait<0>(); promote(acc, t1, s[2]); }
  else { wait<0>(); promote(acc, t0, s[3]); }
#else
  wait<0>(); promote(acc, t0, s[3]);
#endif
  store(out, acc, 0);
#elif defined(TILE_LOOP)
  issue(t0, a, b);
#pragma unroll 1
  for (int tile = 0; tile < tiles; ++tile) {
    for (int i = 0; i < 64; ++i) acc[i] = 0.f;
    int left = k_tiles - 1;
#pragma unroll 1
    for (; left >= 2; left -= 2) {
      issue(t1, a + left, b); wait<1>(); promote(acc, t0, s[left]);
      issue(t0, a + left + 1, b); wait<1>(); promote(acc, t1, s[left + 1]);
    }
    issue(t1, a + 1, b); wait<1>(); promote(acc, t0, s[1]);  // (k_tiles even)
    issue(t0, a + 2, b); wait<1>(); promote(acc, t1, s[2]);  // the next tile's first k-tile
    store(out, acc, tile);                                   // under it
  }
  if (k_tiles < 0) { issue(t1, a, b); wait<1>(); promote(acc, t0, s[1]); wait<0>(); promote(acc, t1, s[2]); }
  else { wait<0>(); promote(acc, t0, s[3]); }
  store(out, acc, 0);
#elif defined(FLAT)
  issue(t0, a, b);
  int left = k_tiles - 1, tile = 0, steps = tiles * k_tiles;
  auto step = [&](float (&cur)[64], float (&nxt)[64], int i) {
    issue(nxt, a + i, b); wait<1>(); promote(acc, cur, s[i]);
    if (left != 0) { --left; return; }
    store(out, acc, tile);  // the epilogue, with the next k-tile in flight
    for (int j = 0; j < 64; ++j) acc[j] = 0.f;
    fence(acc);
    ++tile;
    left = k_tiles - 1;
  };
#pragma unroll 1
  for (; steps >= 2; steps -= 2) {
    step(t0, t1, steps);
    step(t1, t0, steps + 1);
  }
  if (steps == 1) { issue(t1, a, b); wait<1>(); promote(acc, t0, s[1]); wait<0>(); promote(acc, t1, s[2]); }
  else { wait<0>(); promote(acc, t0, s[3]); }
  store(out, acc, 0);
#endif
}
