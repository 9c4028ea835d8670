// Launches SGLang's own CUDA KV-store kernels on raw buffers, for test_layouts_gpu.py.
//
// The kernels come from SGLang's installed sources, unmodified: build with
//   nvcc -std=c++20 -O3 --expt-relaxed-constexpr -arch=sm_XX -DSGL_CUDA_ARCH=XX0
//        -I <sglang>/kernels/jit/include -I <sglang>/kernels/jit/csrc/deepseek_v4
//        -I <tvm_ffi>/include store_harness.cu
// (SGLang's JIT uses the same flags). This file only reads the inputs and launches
// fused_store_flashmla_cache / fused_store_flashmla_cache_v41 / fused_store_indexer_cache
// the way store.cuh's host code does (block 256 for V4, 512 / vec for V4.1, one warp per
// token for the indexer), without PDL. Releases before 0.5.21 have no V4.1 stores: build
// their store.cuh with -DKVCOMPAT_NO_V41 (the test does, when store.cuh lacks them). The
// V4.1 stores take the layouts of the release's KVLayout enum (kv_layout.cuh): 0.5.21 has
// V41 and V41_FP4, 0.5.22 adds UNIFORM_FP8, 0.5.23 V41_NEW and V41_FP4_NEW; build with
// -DKVCOMPAT_HAS_<MEMBER> for each of those three the enum declares (the test does).
//
// usage: store_harness <layout> <page_bits> <dtype bf16|fp32> <n> <input.bin> <loc.bin> <cache.bin>
// cache.bin is read, written in place by the kernel, and written back.
#include "store.cuh"

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace sglang {}  // 0.5.12's store.cuh declares its kernels outside it
using namespace sglang;
#ifndef KVCOMPAT_NO_V41
namespace dv4 = sglang::deepseek_v4;
#endif

static std::vector<char> read_file(const char* path) {
  FILE* f = fopen(path, "rb");
  if (!f) { perror(path); exit(2); }
  fseek(f, 0, SEEK_END);
  long size = ftell(f);
  fseek(f, 0, SEEK_SET);
  std::vector<char> data(size);
  if (fread(data.data(), 1, size, f) != (size_t)size) { perror("read"); exit(2); }
  fclose(f);
  return data;
}

static void write_file(const char* path, const std::vector<char>& data) {
  FILE* f = fopen(path, "wb");
  fwrite(data.data(), 1, data.size(), f);
  fclose(f);
}

#define CHECK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { \
  fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(e)); exit(3); } } while (0)

template <typename Float, uint32_t kPageBits>
void launch_v4(const void* in, void* cache, const void* idx, uint32_t n) {
  FusedStoreCacheParam p{in, cache, idx, n};
  fused_store_flashmla_cache<Float, int64_t, kPageBits, false><<<n, 256>>>(p);
}

#ifndef KVCOMPAT_NO_V41  // releases before 0.5.21 store V4 and the fp8 indexer keys only
template <typename Float, uint32_t kPageBits, dv4::KVLayout kLayout>
void launch_v41(const void* in, void* cache, const void* idx, uint32_t n) {
  FusedStoreCacheV41Param p{in, cache, idx, nullptr, n};
  fused_store_flashmla_cache_v41<Float, int64_t, kPageBits, kLayout, false, false>
      <<<n, 512 / v41_store_vec_size(kLayout)>>>(p);
}
#endif

template <typename Float, uint32_t kPageBits>
void launch_indexer(const void* in, void* cache, const void* idx, uint32_t n) {
  // One warp per token (fused_store_indexer_cache: 4 values per lane).
  FusedStoreCacheParam p{in, cache, idx, n};
  fused_store_indexer_cache<Float, int64_t, kPageBits, false><<<(n * 32 + 255) / 256, 256>>>(p);
}

template <typename Float, uint32_t kPageBits>
void dispatch_layout(const std::string& layout, const void* in, void* cache, const void* idx, uint32_t n) {
  if (layout == "v4") launch_v4<Float, kPageBits>(in, cache, idx, n);
  else if (layout == "dsv4_indexer_fp8") launch_indexer<Float, kPageBits>(in, cache, idx, n);
#ifndef KVCOMPAT_NO_V41
  else if (layout == "v41") launch_v41<Float, kPageBits, dv4::KVLayout::V41>(in, cache, idx, n);
  else if (layout == "v41_fp4") launch_v41<Float, kPageBits, dv4::KVLayout::V41_FP4>(in, cache, idx, n);
#endif
#ifdef KVCOMPAT_HAS_V41_NEW
  else if (layout == "v41_new") launch_v41<Float, kPageBits, dv4::KVLayout::V41_NEW>(in, cache, idx, n);
#endif
#ifdef KVCOMPAT_HAS_V41_FP4_NEW
  else if (layout == "v41_fp4_new") launch_v41<Float, kPageBits, dv4::KVLayout::V41_FP4_NEW>(in, cache, idx, n);
#endif
#ifdef KVCOMPAT_HAS_UNIFORM_FP8
  else if (layout == "uniform_fp8") launch_v41<Float, kPageBits, dv4::KVLayout::UNIFORM_FP8>(in, cache, idx, n);
#endif
  else { fprintf(stderr, "unknown layout %s\n", layout.c_str()); exit(2); }
}

template <typename Float>
void dispatch_page(const std::string& layout, int bits, const void* in, void* cache, const void* idx, uint32_t n) {
  switch (bits) {
    case 1: dispatch_layout<Float, 1>(layout, in, cache, idx, n); break;
    case 2: dispatch_layout<Float, 2>(layout, in, cache, idx, n); break;
    case 6: dispatch_layout<Float, 6>(layout, in, cache, idx, n); break;
    default: fprintf(stderr, "page bits %d not built\n", bits); exit(2);
  }
}

int main(int argc, char** argv) {
  if (argc != 8) { fprintf(stderr, "bad args\n"); return 2; }
  std::string layout = argv[1], dtype = argv[3];
  int bits = atoi(argv[2]);
  uint32_t n = (uint32_t)atoi(argv[4]);
  auto input = read_file(argv[5]);
  auto loc = read_file(argv[6]);
  auto cache = read_file(argv[7]);
  void *d_in, *d_loc, *d_cache;
  CHECK(cudaMalloc(&d_in, input.size()));
  CHECK(cudaMalloc(&d_loc, loc.size()));
  CHECK(cudaMalloc(&d_cache, cache.size()));
  CHECK(cudaMemcpy(d_in, input.data(), input.size(), cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(d_loc, loc.data(), loc.size(), cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(d_cache, cache.data(), cache.size(), cudaMemcpyHostToDevice));
  if (n) {
    if (dtype == "bf16") dispatch_page<bf16_t>(layout, bits, d_in, d_cache, d_loc, n);
    else if (dtype == "fp32") dispatch_page<fp32_t>(layout, bits, d_in, d_cache, d_loc, n);
    else { fprintf(stderr, "dtype %s\n", dtype.c_str()); return 2; }
    CHECK(cudaGetLastError());
    CHECK(cudaDeviceSynchronize());
  }
  CHECK(cudaMemcpy(cache.data(), d_cache, cache.size(), cudaMemcpyDeviceToHost));
  write_file(argv[7], cache);
  return 0;
}
