// Fused pairwise Gaussian-kernel statistics of NCAI's penalties, with analytic gradients.
//
// Built on first use by pyro_bnnlv/stats/_pairwise.py (torch.utils.cpp_extension.load); the
// pure-torch functions there are the reference and the fallback when no compiler is available.
// Both compute the same quantities (the tests compare them at random points); the C++ uses the
// symmetry of the kernels (each pair i < j once, packed row by row), computes in double whatever
// the input dtype (results are cast back), takes squared distances as sums of squared
// differences (the torch path expands |y_i|^2 + |y_j|^2 - 2 y_i.y_j and clamps at 0), and
// exponentiates with ATen's vectorised exp on the packed triangle (in float32 for float32
// inputs, see exp_packed; the triangle is then stored as float32, each exponent rounded once
// from its double value, and read back into double sums). Inner loops run over j with
// contiguous operands (coordinates stored transposed) so that they vectorise; `omp simd
// reduction` lets the compiler reorder those sums (build flag -fopenmp, or -fopenmp-simd where
// the compiler is not GCC: see _compiled.flags), nothing else in a loop.
//
// Hot loops are compiled for AVX2 and the baseline (GCC target_clones, chosen at load time).
//
//  * henze_zirkler(x, beta2, ridge, want_grad) -> (HZ, dHZ/dx): the whole statistic (centring,
//    ML covariance + ridge, Cholesky whitening, both kernel sums) and its gradient through the
//    whitening (formulas above the function);
//  * offdiag_cov_norm(x, want_grad) -> (|offdiag C|_F, gradient);
//  * centred_alignment(a, b, eps, grad_a, grad_b) -> (V, dV/da, dV/db), the normalised HSIC:
//        gamma = 1 / (2 (sum_c Var(p_c) + eps)) per sample (no gradient through it),
//        K = exp(-gamma_a D^a), L = exp(-gamma_b D^b), Kc = HKH, Lc = HLH,
//        V = <Kc, Lc> / sqrt((|Kc|^2 + eps)(|Lc|^2 + eps)),
//        dV/dL = Kc / sqrt(P) - V Lc / (|Lc|^2 + eps)  (symmetric; likewise dV/dK), and
//        dV/db_i = -4 gamma_b sum_j (dV/dL)_ij L_ij (b_i - b_j);
//  * ncai_statistics(x, mu, beta2, ridge, eps, grad_x, grad_mu, parallel=True): the three above in
//    one call, HZ and HSIC side by side on torch's intra-op pool (the registered operator also
//    takes hz_divisor: HZ / hz_divisor, NCAI's per-point HZ, with its gradient, as autograd
//    divides); the operator ncai_statistics_weighted(x, mu, beta2, ridge, eps, hz_divisor, coeffs,
//    scales) adds their weighted penalty as ncai_statistics_collect does, in one node;
//  * ncai_statistics_start(x, mu, beta2, ridge, eps, grad_x, grad_mu) -> handle and
//    ncai_statistics_collect(x, mu, handle, hz_divisor, coeffs, scales): the same call on a worker
//    thread, collected later as the registered operator's outputs after their weighted penalty
//    (as weighted_penalty computes it), so that the caller computes something else meanwhile;
//    (the worker and a collecting caller poll for a while before they sleep: see kPoll);
//  * ncai_penalty_gradient(x, mu, beta2, ridge, eps, hz_divisor, coeffs, scales, handle): the
//    started (handle >= 0) or computed statistics, their weighted penalty and its gradient with
//    respect to mu, without an autograd node (NCAI's training step adds it to the leaf itself);
//  * weighted_penalty(terms, coeffs, scales): NCAI's weighting of the statistics (operator only).
// Empty tensors stand for gradients that were not requested; beta2 is a 0-dim tensor.
// ATen, the operator registry, autograd functions and torch's pybind11 casters: what
// <torch/extension.h> offers minus the C++ frontend (torch/all.h), a third of the build time
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/ThreadLocalState.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>
#include <torch/csrc/utils/pybind.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <thread>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include <pthread.h>

using at::Tensor;

namespace {

// hot loops compiled twice, for AVX2 and the baseline, chosen at load time (GCC function
// multiversioning): the extension stays portable across CPUs of one shared build cache
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define PAIRWISE_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define PAIRWISE_CLONES
#endif

// packed strict upper triangle: row i (pairs (i, j), j = i+1 .. n-1) starts at row_start(n, i)
inline int64_t row_start(int64_t n, int64_t i) { return i * n - i * (i + 1) / 2; }
inline int64_t block_pairs(int64_t n, int64_t i0, int64_t i1) { return row_start(n, i1) - row_start(n, i0); }

// coordinates in double, transposed: pt[c * n + i] = p[i, c]
template <typename S>
void transpose_into(const S* src, int64_t n, int64_t d, double* out) {
  for (int64_t i = 0; i < n; ++i)
    for (int64_t c = 0; c < d; ++c) out[c * n + i] = static_cast<double>(src[i * d + c]);
}
std::vector<double> transposed(const Tensor& p) {
  const int64_t n = p.size(0), d = p.size(1);
  std::vector<double> out(n * d);
  if (p.scalar_type() == at::kFloat) {
    const Tensor c = p.is_contiguous() ? p : p.contiguous();
    transpose_into(c.data_ptr<float>(), n, d, out.data());
  } else if (p.scalar_type() == at::kDouble && p.is_contiguous()) {
    transpose_into(p.data_ptr<double>(), n, d, out.data());
  } else {
    const Tensor c = p.to(at::kDouble).contiguous();
    transpose_into(c.data_ptr<double>(), n, d, out.data());
  }
  return out;
}

// p * scale elementwise (the coordinates scaled by sqrt(gamma) before the pair exponents)
std::vector<double> scaled(const std::vector<double>& p, double scale) {
  std::vector<double> out(p.size());
  for (size_t e = 0; e < p.size(); ++e) out[e] = p[e] * scale;
  return out;
}

// storage that the kernels write in full before reading it (not zeroed, unlike std::vector)
template <typename T>
using Buffer = std::unique_ptr<T[]>;
template <typename T>
Buffer<T> buffer(int64_t size) {
  return Buffer<T>(new T[std::max<int64_t>(size, 1)]);
}


// The packed triangles hold T: double for float64 inputs; float for float32 inputs, whose
// exponentials are taken in float32: their error (~1e-7 relative) is that of the
// float32 result the statistic is returned as, and the float exp is 2x faster (heavy-tail's
// 44,850 pairs: 28 against 58 us). Exponents are computed in double and rounded once on storing;
// every sum reads the stored values into double.
template <typename T>
constexpr at::ScalarType packed_type() {
  return std::is_same<T, float>::value ? at::kFloat : at::kDouble;
}

// exp(t) of float exponents t <= 0 in place, in a loop the compiler vectorises (Cephes' expf,
// branch-free: t = n ln 2 + r with |r| <= ln 2 / 2, a degree-7 polynomial in r, 2^n by the
// exponent bits; relative error below 2.5e-7, tested against torch.exp; build flag
// -fno-trapping-math lets the compiler turn its selects into vector blends); 0 at and below -87,
// where exp(t) < 2^-125 falls out of every sum beside the kernels' unit diagonal.
PAIRWISE_CLONES void exp_nonpositive(float* p, int64_t npairs) {
#pragma omp simd
  for (int64_t e = 0; e < npairs; ++e) {
    const float x = p[e], t = x > -87.0f ? x : -87.0f;
    const float k = t * 1.44269504088896341f + 12582912.0f;  // 1.5 * 2^23: round(t / ln 2) in k's low bits
    const float fn = k - 12582912.0f;
    const float r = (t - fn * 0.693359375f) + fn * 2.12194440e-4f;
    float y = 1.9875691500e-4f;
    y = y * r + 1.3981999507e-3f;
    y = y * r + 8.3334519073e-3f;
    y = y * r + 4.1665795894e-2f;
    y = y * r + 1.6666665459e-1f;
    y = y * r + 5.0000001201e-1f;
    y = y * r * r + r + 1.0f;
    int32_t kb;
    std::memcpy(&kb, &k, sizeof(float));
    const int32_t bits = (kb - 0x4B400000 + 127) << 23;  // 2^round(t / ln 2)
    float scale;
    std::memcpy(&scale, &bits, sizeof(float));
    const float v = y * scale;
    p[e] = x > -87.0f ? v : 0.0f;
  }
}

// exp of a packed triangle of npairs exponents (all <= 0) in place: exp_nonpositive in float,
// ATen's vectorised exp in double
template <typename T>
void exp_packed(T* p, int64_t npairs) {
  if constexpr (std::is_same<T, float>::value)
    exp_nonpositive(p, npairs);
  else
    at::from_blob(p, {npairs}, at::TensorOptions().dtype(packed_type<T>())).exp_();
}

// exponents -|p_i - p_j|^2 of the pairs i < j of the rows i0 .. i1-1 into out (packed from row
// i0's first pair); scale p by sqrt(gamma) first. Summed over the coordinates in double (in
// `row`, n doubles, for float storage) and rounded to T once.
template <typename T>
PAIRWISE_CLONES void pair_exponents(const double* pt, int64_t n, int64_t d, int64_t i0, int64_t i1, T* out,
                                    double* row) {
  for (int64_t i = i0; i < i1; ++i) {
    T* o = out + block_pairs(n, i0, i);
    double* acc = row;
    if constexpr (std::is_same<T, double>::value) acc = o;
    const int64_t m = n - 1 - i;
    for (int64_t c = 0; c < d; ++c) {
      const double pic = pt[c * n + i];
      const double* pj = pt + c * n + i + 1;
      if (c == 0) {
#pragma omp simd
        for (int64_t j = 0; j < m; ++j) acc[j] = -(pic - pj[j]) * (pic - pj[j]);
      } else {
#pragma omp simd
        for (int64_t j = 0; j < m; ++j) acc[j] -= (pic - pj[j]) * (pic - pj[j]);
      }
    }
    if constexpr (!std::is_same<T, double>::value) {
#pragma omp simd
      for (int64_t j = 0; j < m; ++j) o[j] = static_cast<T>(acc[j]);
    }
  }
}

// exp(-|p_i - p_j|^2) of the pairs i < j (packed), as T
template <typename T>
Buffer<T> pair_kernel(const double* pt, int64_t n, int64_t d) {
  Buffer<T> k = buffer<T>(n * (n - 1) / 2);
  std::vector<double> row(std::is_same<T, double>::value ? 0 : n);
  pair_exponents<T>(pt, n, d, 0, n, k.get(), row.data());
  exp_packed<T>(k.get(), n * (n - 1) / 2);
  return k;
}

// for the rows i0 .. i1-1 of a packed symmetric kernel w (packed from row i0's first pair): adds
// its pairs i < j to total and, if q is given, the pair sums q[c * n + i] = sum_j w_ij (p_ic -
// p_jc) (transposed (d, n), all j != i; q zeroed before the first row), row by row
template <typename T>
PAIRWISE_CLONES void kernel_pair_sums(const double* pt, int64_t n, int64_t d, int64_t i0, int64_t i1, const T* w,
                                      double* q, double& total) {
  for (int64_t i = i0; i < i1; ++i) {
    const T* wi = w + block_pairs(n, i0, i);
    const int64_t m = n - 1 - i;
    double t = 0.0;
    if (q == nullptr) {
#pragma omp simd reduction(+ : t)
      for (int64_t j = 0; j < m; ++j) t += wi[j];
    }
    for (int64_t c = 0; q != nullptr && c < d; ++c) {
      const double pic = pt[c * n + i];
      const double* pj = pt + c * n + i + 1;
      double* aj = q + c * n + i + 1;
      double s = 0.0, t0 = 0.0;
#pragma omp simd reduction(+ : s, t0)
      for (int64_t j = 0; j < m; ++j) {
        const double g = wi[j] * (pic - pj[j]);
        t0 += wi[j];
        s += g;
        aj[j] -= g;
      }
      q[c * n + i] += s;
      if (c == 0) t = t0;
    }
    total += t;
  }
}

// pairs per block of kernel_sums_blocked: 256 KiB of T, which stays in cache (a batch of up to 362
// points is one float block: no more exp calls than unblocked)
template <typename T>
constexpr int64_t block_capacity() {
  return (int64_t(1) << 18) / int64_t(sizeof(T));
}

// kernel_pair_sums of the kernel exp(-|p_i - p_j|^2) (exponents of pt_scaled, pair sums of pt),
// built and consumed a block of rows at a time instead of as one packed triangle; the same
// numbers as building it whole (elementwise exp, the same order of every sum)
template <typename T>
double kernel_sums_blocked(const double* pt_scaled, const double* pt, int64_t n, int64_t d, double* q) {
  if (q != nullptr) std::fill(q, q + n * d, 0.0);
  constexpr int64_t capacity = block_capacity<T>();
  Buffer<T> w = buffer<T>(std::max(std::min(capacity, n * (n - 1) / 2), n));
  std::vector<double> row(std::is_same<T, double>::value ? 0 : n);
  double total = 0.0;
  for (int64_t i0 = 0, i1 = 0; i0 < n; i0 = i1) {
    for (i1 = i0 + 1; i1 < n && block_pairs(n, i0, i1 + 1) <= capacity;) ++i1;
    pair_exponents<T>(pt_scaled, n, d, i0, i1, w.get(), row.data());
    exp_packed<T>(w.get(), block_pairs(n, i0, i1));
    kernel_pair_sums<T>(pt, n, d, i0, i1, w.get(), q, total);
  }
  return total;
}

// 1 / (2 h^2), h^2 = sum_c Var(p_c) + eps (divisor n), of transposed coordinates pt (d, n)
double bandwidth_gamma(const double* pt, int64_t n, int64_t d, double eps) {
  double h2 = eps;
  for (int64_t c = 0; c < d; ++c) {
    double m = 0.0, v = 0.0;
    for (int64_t i = 0; i < n; ++i) m += pt[c * n + i];
    m /= double(n);
    for (int64_t i = 0; i < n; ++i) v += (pt[c * n + i] - m) * (pt[c * n + i] - m);
    h2 += v / double(n);
  }
  return 0.5 / h2;
}

// for the row i and j = i+1 .. n-1: acc1[c * n + i] += sum_j w1_j (p_ic - p_jc) and
// acc1[c * n + j] -= w1_j (p_ic - p_jc) (pair sums of a symmetric weight), likewise w2 into acc2
// (pt: transposed coordinates)
inline void accumulate_row(const double* w1, const double* w2, const double* pt, int64_t n,
                           int64_t d, int64_t i, double* acc1, double* acc2) {
  const int64_t m = n - 1 - i;
  for (int64_t c = 0; c < d; ++c) {
    const double pic = pt[c * n + i];
    const double* pj = pt + c * n + i + 1;
    double *a1 = acc1 + c * n + i + 1, *a2 = acc2 + c * n + i + 1;
    double s1 = 0.0, s2 = 0.0;
#pragma omp simd reduction(+ : s1, s2)
    for (int64_t j = 0; j < m; ++j) {
      const double diff = pic - pj[j], g1 = w1[j] * diff, g2 = w2[j] * diff;
      s1 += g1;
      s2 += g2;
      a1[j] -= g1;
      a2[j] -= g2;
    }
    acc1[c * n + i] += s1;
    acc2[c * n + i] += s2;
  }
}

// (n, d) tensor of like's dtype from a transposed (d, n) accumulator: alpha * p + beta * q
// (n, d) tensor of like's dtype from a row-major (n, d) double accumulator (rounded once)
Tensor as_tensor_like(const std::vector<double>& g, int64_t n, int64_t d, const Tensor& like) {
  Tensor out = at::empty({n, d}, like.options().dtype(like.scalar_type() == at::kFloat ? at::kFloat : at::kDouble));
  if (like.scalar_type() == at::kFloat) {
    float* po = out.data_ptr<float>();
    for (int64_t e = 0; e < n * d; ++e) po[e] = static_cast<float>(g[e]);
  } else {
    std::copy(g.begin(), g.end(), out.data_ptr<double>());
  }
  return like.scalar_type() == out.scalar_type() ? out : out.to(like.scalar_type());
}

template <typename S>
void combine_into(const std::vector<double>& p, const std::vector<double>& q, double alpha, double beta, int64_t n,
                  int64_t d, S* out) {
  for (int64_t i = 0; i < n; ++i)
    for (int64_t c = 0; c < d; ++c) out[i * d + c] = static_cast<S>(alpha * p[c * n + i] + beta * q[c * n + i]);
}
Tensor from_transposed(const std::vector<double>& p, const std::vector<double>& q, double alpha,
                       double beta, int64_t n, int64_t d, const Tensor& like) {
  if (like.scalar_type() != at::kFloat && like.scalar_type() != at::kDouble) {
    Tensor grad = at::empty({n, d}, like.options().dtype(at::kDouble));
    combine_into(p, q, alpha, beta, n, d, grad.data_ptr<double>());
    return grad.to(like.scalar_type());
  }
  Tensor grad = at::empty({n, d}, like.options());
  if (like.scalar_type() == at::kFloat)
    combine_into(p, q, alpha, beta, n, d, grad.data_ptr<float>());
  else
    combine_into(p, q, alpha, beta, n, d, grad.data_ptr<double>());
  return grad;
}

// row sums R (unit diagonal included) of a packed symmetric kernel into r; returns the total
template <typename T>
PAIRWISE_CLONES double row_sums(const T* k, int64_t n, std::vector<double>& r) {
  r.assign(n, 1.0);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t q = row_start(n, i), m = n - 1 - i;
    const T* ki = k + q;
    double* rj = r.data() + i + 1;
    double s = 0.0;
#pragma omp simd reduction(+ : s)
    for (int64_t j = 0; j < m; ++j) {
      s += ki[j];
      rj[j] += ki[j];
    }
    r[i] += s;
  }
  double total = 0.0;
  for (int64_t i = 0; i < n; ++i) total += r[i];
  return total;
}

// The Gram matrix of the first sample (the inputs x in NCAI, the same batch at every full-batch
// step), its row sums and total, kept per thread with a copy of the coordinates and bandwidth it
// was computed from: a call whose sample is identical value for value (compared in full, so a
// tensor changed in place or a new tensor at the same address is never mistaken for it) reuses
// it; anything else recomputes. The cached numbers are those a recomputation would give. One
// cache per storage type T (float: exponentials taken in float32).
template <typename T>
struct GramCache {
  std::vector<double> coords, rows;
  Buffer<T> gram;
  double gamma = 0.0, total = 0.0;
  int64_t n = -1, d = -1;
};

template <typename T>
const GramCache<T>& gram_of(const std::vector<double>& pt, int64_t n, int64_t d, double gamma) {
  thread_local GramCache<T> cache;
  const double* p = pt.data();
  const bool same = cache.n == n && cache.d == d && cache.gamma == gamma &&
                    std::equal(p, p + n * d, cache.coords.begin());
  if (same) return cache;
  cache.n = n;
  cache.d = d;
  cache.gamma = gamma;
  cache.coords.assign(p, p + n * d);
  cache.gram = pair_kernel<T>(scaled(pt, std::sqrt(gamma)).data(), n, d);
  cache.total = row_sums(cache.gram.get(), n, cache.rows);
  return cache;
}

template <typename T>
PAIRWISE_CLONES std::tuple<Tensor, Tensor, Tensor> centred_alignment_packed(
    const Tensor& a, const Tensor& b, double eps, bool grad_a, bool grad_b) {
  const int64_t n = a.size(0), da = a.size(1), db = b.size(1);
  const std::vector<double> at_ = transposed(a), bt = transposed(b);
  const double* pa = at_.data();
  const double* pb = bt.data();
  const double gamma_a = bandwidth_gamma(pa, n, da, eps), gamma_b = bandwidth_gamma(pb, n, db, eps);
  const GramCache<T>& cache = gram_of<T>(at_, n, da, gamma_a);  // K: reused while a is unchanged
  const T* pk = cache.gram.get();
  const std::vector<double>& rk = cache.rows;
  const double tk = cache.total;
  const Buffer<T> lv = pair_kernel<T>(scaled(bt, std::sqrt(gamma_b)).data(), n, db);
  const T* pl = lv.get();
  std::vector<double> rl;
  const double tl = row_sums(pl, n, rl);
  // sweep 2: <Kc, Lc>, |Kc|^2, |Lc|^2 with Kc_ij = K_ij - R_i/n - R_j/n + T/n^2 formed explicitly
  // (as the torch path does: no cancellation between large sums), diagonal once, pairs twice;
  // and, since the gradient weights (dV/dL)_ij L_ij = Kc_ij L_ij / root - (V / |Lc|^2) Lc_ij L_ij
  // are linear in the scalars still being summed, the two pair sums of each gradient:
  //   gb1_i = sum_j Kc_ij L_ij (b_i - b_j), gb2_i = sum_j Lc_ij L_ij (b_i - b_j) (likewise for a)
  const double inv_n = 1.0 / double(n);
  double num = 0.0, ckk = 0.0, cll = 0.0, pnum = 0.0, pkk = 0.0, pll = 0.0;
  std::vector<double> ga1(grad_a ? n * da : 0, 0.0), ga2(grad_a ? n * da : 0, 0.0);
  std::vector<double> gb1(grad_b ? n * db : 0, 0.0), gb2(grad_b ? n * db : 0, 0.0);
  std::vector<double> w1(n), w2(n);
  for (int64_t i = 0; i < n; ++i) {
    const double ok = (tk * inv_n - rk[i]) * inv_n, ol = (tl * inv_n - rl[i]) * inv_n;
    const double kd = 1.0 + ok - rk[i] * inv_n, ld = 1.0 + ol - rl[i] * inv_n;
    num += kd * ld;
    ckk += kd * kd;
    cll += ld * ld;
    const int64_t q = row_start(n, i), m = n - 1 - i;
    const T *ki = pk + q, *li = pl + q;
    const double *rkj = rk.data() + i + 1, *rlj = rl.data() + i + 1;
    double s1 = 0.0, s2 = 0.0, s3 = 0.0;
    if (grad_b && db == 1) {  // one-dimensional b (NCAI's K = 1): sums and gradient in one loop
      const double bi = pb[i], *bj = pb + i + 1;
      double *a1 = gb1.data() + i + 1, *a2 = gb2.data() + i + 1;
      double t1 = 0.0, t2 = 0.0;
#pragma omp simd reduction(+ : s1, s2, s3, t1, t2)
      for (int64_t j = 0; j < m; ++j) {
        const double kc = ki[j] + ok - rkj[j] * inv_n, lc = li[j] + ol - rlj[j] * inv_n;
        s1 += kc * lc;
        s2 += kc * kc;
        s3 += lc * lc;
        const double ld = li[j] * (bi - bj[j]), g1 = kc * ld, g2 = lc * ld;
        t1 += g1;
        t2 += g2;
        a1[j] -= g1;
        a2[j] -= g2;
      }
      gb1[i] += t1;
      gb2[i] += t2;
    } else {
#pragma omp simd reduction(+ : s1, s2, s3)
      for (int64_t j = 0; j < m; ++j) {
        const double kc = ki[j] + ok - rkj[j] * inv_n, lc = li[j] + ol - rlj[j] * inv_n;
        s1 += kc * lc;
        s2 += kc * kc;
        s3 += lc * lc;
      }
    }
    pnum += s1;
    pkk += s2;
    pll += s3;
    if (grad_b && db != 1) {
#pragma omp simd
      for (int64_t j = 0; j < m; ++j) {
        w1[j] = (ki[j] + ok - rkj[j] * inv_n) * li[j];
        w2[j] = (li[j] + ol - rlj[j] * inv_n) * li[j];
      }
      accumulate_row(w1.data(), w2.data(), pb, n, db, i, gb1.data(), gb2.data());
    }
    if (grad_a) {
#pragma omp simd
      for (int64_t j = 0; j < m; ++j) {
        w1[j] = (li[j] + ol - rlj[j] * inv_n) * ki[j];
        w2[j] = (ki[j] + ok - rkj[j] * inv_n) * ki[j];
      }
      accumulate_row(w1.data(), w2.data(), pa, n, da, i, ga1.data(), ga2.data());
    }
  }
  num += 2.0 * pnum;
  ckk += 2.0 * pkk + eps;
  cll += 2.0 * pll + eps;
  const double root = std::sqrt(ckk * cll), v = num / root;
  Tensor value = at::full({}, v, a.options());
  // dV/db_i = -4 gamma_b sum_j (dV/dL)_ij L_ij (b_i - b_j) = -4 gamma_b (gb1_i / root - V gb2_i / |Lc|^2)
  Tensor ga = grad_a ? from_transposed(ga1, ga2, -4.0 * gamma_a / root, 4.0 * gamma_a * v / ckk, n, da, a)
                     : at::empty({0}, a.options());
  Tensor gb = grad_b ? from_transposed(gb1, gb2, -4.0 * gamma_b / root, 4.0 * gamma_b * v / cll, n, db, b)
                     : at::empty({0}, b.options());
  return {value, ga, gb};
}

std::tuple<Tensor, Tensor, Tensor> centred_alignment(const Tensor& a, const Tensor& b, double eps, bool grad_a,
                                                     bool grad_b) {
  TORCH_CHECK(a.dim() == 2 && b.dim() == 2 && a.size(0) == b.size(0),
              "centred_alignment: a and b must be (n, da), (n, db)");
  if (a.scalar_type() == at::kFloat && b.scalar_type() == at::kFloat)
    return centred_alignment_packed<float>(a, b, eps, grad_a, grad_b);
  return centred_alignment_packed<double>(a, b, eps, grad_a, grad_b);
}

// Henze-Zirkler statistic of x (n, k) and its gradient (see henze_zirkler in dependence.py):
//   u_i = x_i - xbar, C = U'U / n, S = C + (ridge tr(C) / k + 1e-30) I = L L', y_i = L^{-1} u_i,
//   HZ = (1/n) sum_ij exp(-g1 |y_i - y_j|^2) - c2 sum_i exp(-g2 |y_i|^2) + c3,
// with g1 = beta^2 / 2, g2 = beta^2 / (2 (1 + beta^2)), c2 = 2 (1 + beta^2)^{-k/2}. Gradient, with
// P = S^{-1}, E the pair kernel, e_i = exp(-g2 |y_i|^2), q_i = sum_j E_ij (y_i - y_j):
//   h_i = -(4 g1 / n) L q_i + 2 c2 g2 e_i u_i           (dHZ/du_i at fixed P is P h_i)
//   G_P = (1/2) sum_i u_i h_i'  (symmetrised)            (dHZ/dP at fixed U)
//   G_S = -P G_P P,  G_C = G_S + (ridge / k) tr(G_S) I   (through S^{-1} and the ridge)
//   dHZ/du_i = P h_i + (2 / n) G_C u_i,  dHZ/dx_i = dHZ/du_i - mean_l dHZ/du_l.
PAIRWISE_CLONES std::tuple<Tensor, Tensor> henze_zirkler(const Tensor& x, const Tensor& beta2_t, double ridge, bool want_grad) {
  TORCH_CHECK(x.dim() == 2, "henze_zirkler: x must be (n, k)");
  const double beta2 = beta2_t.scalar_type() == at::kDouble && beta2_t.is_contiguous() ? *beta2_t.data_ptr<double>()
                                                                                   : beta2_t.item<double>();
  const int64_t n = x.size(0), k = x.size(1);
  const std::vector<double> xt = transposed(x);  // (k, n) double
  const double* px = xt.data();
  std::vector<double> u(k * n), cov(k * k, 0.0), chol(k * k, 0.0), yt(k * n);
  for (int64_t c = 0; c < k; ++c) {
    double m = 0.0;
    for (int64_t i = 0; i < n; ++i) m += px[c * n + i];
    m /= double(n);
    for (int64_t i = 0; i < n; ++i) u[c * n + i] = px[c * n + i] - m;
  }
  for (int64_t a = 0; a < k; ++a)
    for (int64_t b = 0; b <= a; ++b) {
      double s = 0.0;
      for (int64_t i = 0; i < n; ++i) s += u[a * n + i] * u[b * n + i];
      cov[a * k + b] = cov[b * k + a] = s / double(n);
    }
  double trace = 0.0;
  for (int64_t a = 0; a < k; ++a) trace += cov[a * k + a];
  std::vector<double> s_mat(cov);
  for (int64_t a = 0; a < k; ++a) s_mat[a * k + a] += ridge * trace / double(k) + 1e-30;
  // Cholesky S = L L' (lower, row-major)
  for (int64_t a = 0; a < k; ++a)
    for (int64_t b = 0; b <= a; ++b) {
      double s = s_mat[a * k + b];
      for (int64_t c = 0; c < b; ++c) s -= chol[a * k + c] * chol[b * k + c];
      chol[a * k + b] = a == b ? std::sqrt(s) : s / chol[b * k + b];
    }
  // y = L^{-1} u by forward substitution, column by column of the transposed layout
  for (int64_t a = 0; a < k; ++a)
    for (int64_t i = 0; i < n; ++i) {
      double s = u[a * n + i];
      for (int64_t c = 0; c < a; ++c) s -= chol[a * k + c] * yt[c * n + i];
      yt[a * n + i] = s / chol[a * k + a];
    }
  const double g1 = 0.5 * beta2, g2 = beta2 / (2.0 * (1.0 + beta2));
  const double c2 = 2.0 * std::pow(1.0 + beta2, -0.5 * double(k));
  const double c3 = double(n) * std::pow(1.0 + 2.0 * beta2, -0.5 * double(k));
  std::vector<double> ys(yt);
  for (double& v : ys) v *= std::sqrt(g1);
  std::vector<double> ei(n);
  double term2 = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    double d = 0.0;
    for (int64_t c = 0; c < k; ++c) d += yt[c * n + i] * yt[c * n + i];
    ei[i] = std::exp(-g2 * d);
    term2 += ei[i];
  }
  // q_i = sum_j E_ij (y_i - y_j) (transposed (k, n)) with the sum of E, in one sweep
  std::vector<double> qv(want_grad ? k * n : 0);
  double* qp = want_grad ? qv.data() : nullptr;
  const double pairs = x.scalar_type() == at::kFloat ? kernel_sums_blocked<float>(ys.data(), yt.data(), n, k, qp)
                                                     : kernel_sums_blocked<double>(ys.data(), yt.data(), n, k, qp);
  const double hz = (double(n) + 2.0 * pairs) / double(n) - c2 * term2 + c3;
  Tensor value = at::full({}, hz, x.options());
  if (!want_grad) return {value, at::empty({0}, x.options())};
  const double* q = qv.data();
  std::vector<double> h(k * n);
  for (int64_t a = 0; a < k; ++a)
    for (int64_t i = 0; i < n; ++i) {
      double lq = 0.0;
      for (int64_t c = 0; c <= a; ++c) lq += chol[a * k + c] * q[c * n + i];
      h[a * n + i] = -(4.0 * g1 / double(n)) * lq + 2.0 * c2 * g2 * ei[i] * u[a * n + i];
    }
  // P = S^{-1} = L^{-T} L^{-1}
  std::vector<double> linv(k * k, 0.0), p(k * k, 0.0), gp(k * k, 0.0), tmp(k * k, 0.0), gc(k * k, 0.0);
  for (int64_t b = 0; b < k; ++b)
    for (int64_t a = b; a < k; ++a) {
      double s = a == b ? 1.0 : 0.0;
      for (int64_t c = b; c < a; ++c) s -= chol[a * k + c] * linv[c * k + b];
      linv[a * k + b] = s / chol[a * k + a];
    }
  for (int64_t a = 0; a < k; ++a)
    for (int64_t b = 0; b < k; ++b) {
      double s = 0.0;
      for (int64_t c = 0; c < k; ++c) s += linv[c * k + a] * linv[c * k + b];
      p[a * k + b] = s;
    }
  for (int64_t a = 0; a < k; ++a)
    for (int64_t b = 0; b < k; ++b) {
      double s = 0.0;
      for (int64_t i = 0; i < n; ++i) s += u[a * n + i] * h[b * n + i] + u[b * n + i] * h[a * n + i];
      gp[a * k + b] = 0.25 * s;
    }
  for (int64_t a = 0; a < k; ++a)  // tmp = P G_P
    for (int64_t b = 0; b < k; ++b) {
      double s = 0.0;
      for (int64_t c = 0; c < k; ++c) s += p[a * k + c] * gp[c * k + b];
      tmp[a * k + b] = s;
    }
  double tr_gs = 0.0;
  for (int64_t a = 0; a < k; ++a)  // G_S = -P G_P P
    for (int64_t b = 0; b < k; ++b) {
      double s = 0.0;
      for (int64_t c = 0; c < k; ++c) s += tmp[a * k + c] * p[c * k + b];
      gc[a * k + b] = -s;
      if (a == b) tr_gs -= s;
    }
  for (int64_t a = 0; a < k; ++a) gc[a * k + a] += ridge / double(k) * tr_gs;
  std::vector<double> gd(n * k);
  double* pg = gd.data();
  std::vector<double> mean_g(k, 0.0);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t a = 0; a < k; ++a) {
      double s = 0.0;
      for (int64_t c = 0; c < k; ++c) s += p[a * k + c] * h[c * n + i] + 2.0 / double(n) * gc[a * k + c] * u[c * n + i];
      pg[i * k + a] = s;
      mean_g[a] += s;
    }
  for (int64_t i = 0; i < n; ++i)
    for (int64_t a = 0; a < k; ++a) pg[i * k + a] -= mean_g[a] / double(n);
  return {value, as_tensor_like(gd, n, k, x)};
}

// |offdiag C|_F of the ML covariance C = U'U / n (u_i = x_i - xbar; offdiag_cov_norm in
// dependence.py with correction=0) and its gradient: with G = offdiag(C) / |offdiag C|_F (0 when
// the norm is 0, torch's subgradient), dF/du_i = (2/n) G u_i, dF/dx_i = dF/du_i - mean_l dF/du_l
// (= dF/du_i, since sum_i u_i = 0).
std::tuple<Tensor, Tensor> offdiag_cov_norm(const Tensor& x, bool want_grad) {
  TORCH_CHECK(x.dim() == 2, "offdiag_cov_norm: x must be (n, k)");
  const int64_t n = x.size(0), k = x.size(1);
  if (k == 1)  // no off-diagonal entries: 0, with zero gradient
    return {at::zeros({}, x.options()), want_grad ? at::zeros_like(x) : at::empty({0}, x.options())};
  const Tensor u = x.to(at::kDouble) - x.to(at::kDouble).mean(0, true);
  const Tensor cov = u.t().mm(u) / double(n);
  const Tensor off = cov - at::diag_embed(cov.diagonal());
  const double norm = std::sqrt(off.square().sum().item<double>());
  Tensor value = at::full({}, norm, x.options());
  if (!want_grad) return {value, at::empty({0}, x.options())};
  if (norm == 0.0) return {value, at::zeros_like(x)};
  return {value, (u.mm(off / norm) * (2.0 / double(n))).to(x.scalar_type())};
}

// The three NCAI statistics of one batch in one call: Henze-Zirkler of mu, the off-diagonal
// covariance norm of mu and the normalised HSIC of (x, mu), with their gradients (empty tensors
// where not requested): (hz, offdiag, hsic, d hz/d mu, d offdiag/d mu, d hsic/d mu, d hsic/d x).
std::vector<Tensor> ncai_statistics(const Tensor& x, const Tensor& mu, const Tensor& beta2, double ridge,
                                    double eps, bool grad_x, bool grad_mu, bool parallel) {
  std::tuple<Tensor, Tensor> hz, off;
  std::tuple<Tensor, Tensor, Tensor> hsic;
  const auto part = [&](int64_t k) {
    if (k == 0) {
      hz = henze_zirkler(mu, beta2, ridge, grad_mu);
      off = offdiag_cov_norm(mu, grad_mu);
    } else {
      hsic = centred_alignment(x, mu, eps, grad_x, grad_mu);
    }
  };
  if (parallel && at::get_num_threads() > 1 && !at::in_parallel_region()) {
    const at::ThreadLocalState state;
    at::parallel_for(0, 2, 1, [&](int64_t begin, int64_t end) {
      at::ThreadLocalStateGuard guard(state);
      for (int64_t k = begin; k < end; ++k) part(k);
    });
  } else {
    part(0);
    part(1);
  }
  return {std::get<0>(hz), std::get<0>(off), std::get<0>(hsic), std::get<1>(hz),
          std::get<1>(off), std::get<2>(hsic), std::get<1>(hsic)};
}

// t / divisor as ATen divides a tensor by a Python number (HZ per point; 1: t itself)
Tensor divided(const Tensor& t, double divisor) { return divisor == 1.0 ? t : t / divisor; }

// a0 s0 + a1 s1 + a2 s2 of (n, k) tensors s0..s2 and numbers a0..a2 (of the tensors' type S, float
// or double: exact in S), in one loop as the ATen expression computes it
template <typename S>
Tensor weighted_sum3_loop(const double (&a)[3], const std::vector<Tensor>& s) {
  const S a0 = static_cast<S>(a[0]), a1 = static_cast<S>(a[1]), a2 = static_cast<S>(a[2]);
  const S *s0 = s[0].data_ptr<S>(), *s1 = s[1].data_ptr<S>(), *s2 = s[2].data_ptr<S>();
  Tensor out = at::empty(s[0].sizes(), s[0].options());
  S* po = out.data_ptr<S>();
  const int64_t size = s[0].numel();
  for (int64_t e = 0; e < size; ++e) {
    const S t = a0 * s0[e] + a1 * s1[e];
    po[e] = t + a2 * s2[e];
  }
  return out;
}
Tensor weighted_sum3(const double (&a)[3], const std::vector<Tensor>& s) {
  const at::ScalarType type = s[0].scalar_type();
  bool loop = type == at::kFloat || type == at::kDouble;
  for (int k = 0; k < 3; ++k)
    loop = loop && s[k].scalar_type() == type && s[k].is_contiguous() && s[k].sizes() == s[0].sizes();
  if (!loop) return s[0] * a[0] + s[1] * a[1] + s[2] * a[2];
  return type == at::kFloat ? weighted_sum3_loop<float>(a, s) : weighted_sum3_loop<double>(a, s);
}

// a 0-dim gradient as a number; 0 for an undefined one (an output that reached no loss: the
// nodes do not materialise zeros)
double scalar_of(const Tensor& g) {
  if (!g.defined()) return 0.0;
  if (g.dim() == 0 && g.device().is_cpu() && g.scalar_type() == at::kFloat) return *g.data_ptr<float>();
  if (g.dim() == 0 && g.device().is_cpu() && g.scalar_type() == at::kDouble) return *g.data_ptr<double>();
  return g.item<double>();
}

// The outputs of the statistics' autograd nodes from ncai_statistics' seven tensors: the values
// (HZ divided by hz_divisor), the gradients saved for backward
torch::autograd::variable_list statistics_outputs(torch::autograd::AutogradContext* ctx, const std::vector<Tensor>& out,
                                                  bool gx, bool gmu, double hz_divisor) {
  ctx->set_materialize_grads(false);  // an output that reached no loss: an undefined gradient, read as 0
  ctx->save_for_backward({out[3], out[4], out[5], out[6]});
  ctx->saved_data["gx"] = gx;
  ctx->saved_data["gmu"] = gmu;
  ctx->saved_data["hz_divisor"] = hz_divisor;
  return {divided(out[0], hz_divisor), out[1], out[2]};
}

// The loss's derivatives a_k with respect to the three statistics, from their outputs' gradients
// g_k and, for the weighted nodes, the penalty's g_pen through each nonzero slope, then HZ's through
// its division by hz_divisor: a_k = g_k + g_pen slope_k, a_0 / hz_divisor, in the statistics' type
// S and rounded as ATen rounds a tensor-by-number operation of that type (the number converted to S
// first): the numbers autograd gives a penalty node and a statistics node apart
template <typename S>
void derivatives_in(const double (&g)[3], double g_pen, const std::vector<double>& slopes, double hz_divisor,
                    double (&a)[3]) {
  for (size_t k = 0; k < 3; ++k) {
    S v = static_cast<S>(g[k]);
    if (!slopes.empty() && slopes[k] != 0.0) v = v + static_cast<S>(static_cast<S>(g_pen) * static_cast<S>(slopes[k]));
    if (k == 0 && hz_divisor != 1.0) v = v / static_cast<S>(hz_divisor);
    a[k] = static_cast<double>(v);
  }
}

// dL/dmu = sum_k a_k dstat_k/dmu and dL/dx = a_hsic dhsic/dx from the saved gradients s of the
// statistics (derivatives_in for a_k); undefined where not wanted
std::tuple<Tensor, Tensor> statistics_grads(const std::vector<Tensor>& s, bool gx, bool gmu, double hz_divisor,
                                            const double (&g)[3], double g_pen, const std::vector<double>& slopes) {
  double a[3];
  if (s[0].defined() && s[0].scalar_type() == at::kDouble)
    derivatives_in<double>(g, g_pen, slopes, hz_divisor, a);
  else
    derivatives_in<float>(g, g_pen, slopes, hz_divisor, a);
  Tensor dmu, dx;
  if (gmu) dmu = weighted_sum3(a, s);
  if (gx) dx = s[3] * a[2];
  return {dx, dmu};
}

// backward of the nodes: statistics_grads of the node's saved gradients, from the outputs'
// gradients (the weighted nodes: (penalty, hz, offdiag, hsic), else (hz, offdiag, hsic))
torch::autograd::variable_list statistics_backward(torch::autograd::AutogradContext* ctx,
                                                   const torch::autograd::variable_list& g, size_t extra) {
  // first-order only: with create_graph=True (Hessians, Hessian-vector products) the
  // statistics' curvature would be silently missing, so refuse instead
  TORCH_CHECK(!at::GradMode::is_enabled(),
              "pyro_bnnlv's Henze-Zirkler / HSIC kernels have first-order gradients only: second "
              "derivatives (create_graph=True, torch.autograd.functional.hessian, Hessian-vector "
              "products) through them are not supported");
  const bool weighted = g.size() == 4;
  const std::vector<double> slopes = weighted ? ctx->saved_data["slopes"].toDoubleVector() : std::vector<double>();
  const double gs[3] = {scalar_of(g[weighted]), scalar_of(g[weighted + 1]), scalar_of(g[weighted + 2])};
  auto [dx, dmu] = statistics_grads(ctx->get_saved_variables(), ctx->saved_data["gx"].toBool(),
                                    ctx->saved_data["gmu"].toBool(), ctx->saved_data["hz_divisor"].toDouble(), gs,
                                    weighted ? scalar_of(g[0]) : 0.0, slopes);
  torch::autograd::variable_list grads = {dx, dmu};
  grads.resize(2 + extra);  // no gradient for the other inputs
  return grads;
}

// The fused statistics as a registered operator with a C++ autograd node, so that a traced
// graph calls it natively (no Python per step): torch.ops.pyro_bnnlv_pairwise.ncai_statistics.
class NcaiStatisticsFn : public torch::autograd::Function<NcaiStatisticsFn> {
 public:
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx,
                                                const Tensor& x, const Tensor& mu,
                                                const Tensor& beta2, double ridge, double eps,
                                                double hz_divisor) {
    const bool gx = x.requires_grad(), gmu = mu.requires_grad();
    return statistics_outputs(ctx, ncai_statistics(x, mu, beta2, ridge, eps, gx, gmu, true), gx, gmu, hz_divisor);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list g) {
    return statistics_backward(ctx, g, 4);
  }
};

// Polls `ready` until it holds or `poll` has passed; true if it holds. The first reads are a busy
// wait (a result due within microseconds); after that each read follows a yield of the CPU, so
// that a polling thread on an oversubscribed machine (more runnable threads than cores: torch's
// spinning intra-op threads, another process) hands its core to the thread whose work it waits for
// instead of holding it for a scheduler time slice.
template <typename Ready>
bool poll_for(const Ready& ready, std::chrono::steady_clock::duration poll) {
  for (int spins = 0; spins < 64; ++spins) {
    if (ready()) return true;
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
  }
  const auto until = std::chrono::steady_clock::now() + poll;
  while (!ready()) {
    if (std::chrono::steady_clock::now() >= until) return false;
    std::this_thread::yield();
  }
  return true;
}

// How long the worker polls for the next job before it sleeps, and a collecting caller polls for
// a result before it blocks. A training loop starts a job every step (a millisecond or so at
// NCAI's batch sizes): polling, the worker takes the next one without being woken, and the
// caller its result without sleeping; a sleeping thread's wake-up costs tens of microseconds (a
// system call and, on a virtual machine, an interrupt between virtual CPUs), a sizeable part of
// a step. The worker runs only where a core is free of torch's intra-op pool (ncai.py).
constexpr auto kPoll = std::chrono::milliseconds(2);

// Statistics started on a worker thread of this extension and collected by handle: the same
// ncai_statistics call, so the same numbers as the synchronous operator; an exception in the
// worker is raised by the collecting call. A handle is collected or discarded once. The worker
// reads the inputs while the caller goes on: they must not change before the collection (the
// Python side checks their version counters). One plain std::thread, not ATen's inter-op pool:
// its tasks carry no thread-local state, and the same thread keeps the Gram cache of the inputs.
// A forked child starts a worker of its own (the parent's handles are unknown there).
class StatisticsWorker {
 public:
  // a started job: its result, and a flag set once it is ready (polled before blocking on it)
  struct Job {
    std::packaged_task<std::vector<Tensor>()> work;
    std::future<std::vector<Tensor>> result;
    std::atomic<bool> done{false};
  };

  static StatisticsWorker& get() {
    static std::once_flag registered;
    std::call_once(registered, [] {
      pthread_atfork(nullptr, nullptr, [] {  // the child: a fresh lock (the parent's may be held) and no worker
        creating() = new std::mutex();
        instance() = nullptr;
      });
    });
    std::lock_guard<std::mutex> lock(*creating());  // callers on several threads create one worker
    StatisticsWorker*& w = instance();
    if (w == nullptr) w = new StatisticsWorker();  // never freed: no destructor races the thread at exit
    return *w;
  }

  int64_t start(std::function<std::vector<Tensor>()> work) {
    auto job = std::make_shared<Job>();
    job->work = std::packaged_task<std::vector<Tensor>()>(std::move(work));
    job->result = job->work.get_future();
    std::lock_guard<std::mutex> lock(mutex_);
    const int64_t handle = next_++;
    pending_.emplace(handle, job);
    queue_.push_back(job);
    queued_.store(true, std::memory_order_release);
    if (sleeping_) ready_.notify_one();  // a polling worker sees queued_
    return handle;
  }

  // the handle's job (throw_unknown: an error for an unknown handle; else null)
  std::shared_ptr<Job> take(int64_t handle, bool throw_unknown) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = pending_.find(handle);
    if (it == pending_.end()) {
      TORCH_CHECK(!throw_unknown, "ncai_statistics_collect: unknown or already collected handle ", handle);
      return nullptr;
    }
    std::shared_ptr<Job> job = std::move(it->second);
    pending_.erase(it);
    return job;
  }

  // the job's result (or its exception), polled for kPoll before blocking
  static std::vector<Tensor> result(Job& job) {
    poll_for([&job] { return job.done.load(std::memory_order_acquire); }, kPoll);
    return job.result.get();
  }

 private:
  StatisticsWorker() : thread_([this] { loop(); }) { thread_.detach(); }

  static StatisticsWorker*& instance() {
    static StatisticsWorker* w = nullptr;
    return w;
  }

  static std::mutex*& creating() {
    static std::mutex* m = new std::mutex();  // never freed, like the worker
    return m;
  }

  void loop() {
    for (;;) {
      poll_for([this] { return queued_.load(std::memory_order_acquire); }, kPoll);
      std::shared_ptr<Job> job;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        sleeping_ = true;  // read by start under the lock: no wake-up is lost
        ready_.wait(lock, [this] { return !queue_.empty(); });
        sleeping_ = false;
        job = std::move(queue_.front());
        queue_.pop_front();
        queued_.store(!queue_.empty(), std::memory_order_relaxed);
      }
      job->work();
      job->done.store(true, std::memory_order_release);
    }
  }

  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<std::shared_ptr<Job>> queue_;
  std::unordered_map<int64_t, std::shared_ptr<Job>> pending_;
  std::atomic<bool> queued_{false};
  bool sleeping_ = false;
  int64_t next_ = 0;
  std::thread thread_;
};

int64_t ncai_statistics_start(const Tensor& x, const Tensor& mu, const Tensor& beta2, double ridge, double eps,
                              bool grad_x, bool grad_mu) {
  // tensors of the worker's own (detached: the same storage, no autograd history and no Python
  // object): dropping the last reference to a tensor that Python also holds takes the GIL, which
  // the collecting caller holds while it waits for the worker
  const Tensor xd = x.detach(), md = mu.detach(), bd = beta2.detach();
  return StatisticsWorker::get().start([=] { return ncai_statistics(xd, md, bd, ridge, eps, grad_x, grad_mu, false); });
}

// the started statistics of a handle, once ready
std::vector<Tensor> take_pending(int64_t handle) {
  return StatisticsWorker::result(*StatisticsWorker::get().take(handle, true));
}

// waits for a started computation without using it (a step that failed before collecting)
void ncai_statistics_discard(int64_t handle) {
  std::shared_ptr<StatisticsWorker::Job> job = StatisticsWorker::get().take(handle, false);
  if (job) job->result.wait();
}

std::tuple<double, std::vector<double>> weighted_penalty_value(at::TensorList terms, at::ArrayRef<double> coeffs,
                                                               at::ArrayRef<double> scales);

// NCAI's weighted penalty of the three statistics (weighted_penalty_value over those with a
// nonzero coefficient, in their order: hz, offdiag, hsic) and the slope of each (0 if left out)
std::tuple<double, std::vector<double>> weighted_statistics(const torch::autograd::variable_list& stats,
                                                            at::ArrayRef<double> coeffs, at::ArrayRef<double> scales) {
  TORCH_CHECK(coeffs.size() == 3 && scales.size() == 3,
              "ncai_statistics_collect / ncai_statistics_weighted: one coefficient and one scale per statistic "
              "(hz, offdiag, hsic)");
  std::vector<Tensor> terms;
  std::vector<double> c, e;
  std::vector<size_t> which;
  for (size_t k = 0; k < 3; ++k) {
    if (coeffs[k] == 0.0) continue;
    terms.push_back(stats[k]);
    c.push_back(coeffs[k]);
    e.push_back(scales[k]);
    which.push_back(k);
  }
  std::vector<double> slopes(3, 0.0);
  if (terms.empty()) return {0.0, slopes};
  auto [value, selected] = weighted_penalty_value(terms, c, e);
  for (size_t i = 0; i < which.size(); ++i) slopes[which[i]] = selected[i];
  return {value, slopes};
}

// a node's outputs (penalty, hz, offdiag, hsic) from ncai_statistics' outputs, and its backward:
// each statistic's gradient plus the penalty's through its slope, as weighted_penalty's node
// would pass it (g[0] * slope) to the statistics' node; `extra` inputs after x and mu
torch::autograd::variable_list weighted_outputs(torch::autograd::AutogradContext* ctx, const std::vector<Tensor>& out,
                                                double hz_divisor, at::ArrayRef<double> coeffs,
                                                at::ArrayRef<double> scales) {
  auto stats = statistics_outputs(ctx, out, out[6].numel() > 0, out[3].numel() > 0, hz_divisor);
  auto [value, slopes] = weighted_statistics(stats, coeffs, scales);
  ctx->saved_data["slopes"] = slopes;
  return {at::scalar_tensor(value, stats[0].options()), stats[0], stats[1], stats[2]};
}

// the started statistics as the outputs of an autograd node on x and mu (the tensors they were
// started on, or others holding the same values), after their weighted penalty (coefficients 0:
// a zero penalty): one node where the statistics and weighted_penalty would be two, with the
// same values and gradients (the gradient flags are those of the start)
class NcaiStatisticsCollectFn : public torch::autograd::Function<NcaiStatisticsCollectFn> {
 public:
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, const Tensor& x,
                                                const Tensor& mu, int64_t handle, double hz_divisor,
                                                std::vector<double> coeffs, std::vector<double> scales) {
    return weighted_outputs(ctx, take_pending(handle), hz_divisor, coeffs, scales);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list g) {
    return statistics_backward(ctx, g, 4);
  }
};

// the same node with the statistics computed on the calling thread (and torch's intra-op pool)
class NcaiStatisticsWeightedFn : public torch::autograd::Function<NcaiStatisticsWeightedFn> {
 public:
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, const Tensor& x,
                                                const Tensor& mu, const Tensor& beta2, double ridge, double eps,
                                                double hz_divisor, std::vector<double> coeffs,
                                                std::vector<double> scales) {
    const bool gx = x.requires_grad(), gmu = mu.requires_grad();
    return weighted_outputs(ctx, ncai_statistics(x, mu, beta2, ridge, eps, gx, gmu, true), hz_divisor, coeffs,
                            scales);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list g) {
    return statistics_backward(ctx, g, 6);
  }
};

std::tuple<Tensor, Tensor, Tensor, Tensor> ncai_statistics_weighted_autograd(
    const Tensor& x, const Tensor& mu, const Tensor& beta2, double ridge, double eps, double hz_divisor,
    at::ArrayRef<double> coeffs, at::ArrayRef<double> scales) {
  auto r = NcaiStatisticsWeightedFn::apply(x, mu, beta2, ridge, eps, hz_divisor, coeffs.vec(), scales.vec());
  return {r[0], r[1], r[2], r[3]};
}

// the values of the outputs without gradients (the CPU kernel under the autograd one)
std::tuple<Tensor, Tensor, Tensor, Tensor> weighted_values(const std::vector<Tensor>& out, double hz_divisor,
                                                           at::ArrayRef<double> coeffs,
                                                           at::ArrayRef<double> scales) {
  torch::autograd::variable_list stats = {divided(out[0], hz_divisor), out[1], out[2]};
  const double value = std::get<0>(weighted_statistics(stats, coeffs, scales));
  return {at::scalar_tensor(value, stats[0].options()), stats[0], stats[1], stats[2]};
}

std::tuple<Tensor, Tensor, Tensor, Tensor> ncai_statistics_weighted_cpu(const Tensor& x, const Tensor& mu,
                                                                        const Tensor& beta2, double ridge,
                                                                        double eps, double hz_divisor,
                                                                        at::ArrayRef<double> coeffs,
                                                                        at::ArrayRef<double> scales) {
  return weighted_values(ncai_statistics(x, mu, beta2, ridge, eps, false, false, true), hz_divisor, coeffs, scales);
}

std::tuple<Tensor, Tensor, Tensor, Tensor> ncai_statistics_collect_autograd(const Tensor& x, const Tensor& mu,
                                                                            int64_t handle, double hz_divisor,
                                                                            at::ArrayRef<double> coeffs,
                                                                            at::ArrayRef<double> scales) {
  auto r = NcaiStatisticsCollectFn::apply(x, mu, handle, hz_divisor, coeffs.vec(), scales.vec());
  return {r[0], r[1], r[2], r[3]};
}

std::tuple<Tensor, Tensor, Tensor, Tensor> ncai_statistics_collect_cpu(const Tensor& x, const Tensor& mu,
                                                                       int64_t handle, double hz_divisor,
                                                                       at::ArrayRef<double> coeffs,
                                                                       at::ArrayRef<double> scales) {
  return weighted_values(take_pending(handle), hz_divisor, coeffs, scales);
}

std::tuple<Tensor, Tensor, Tensor> ncai_statistics_autograd(const Tensor& x, const Tensor& mu,
                                                            const Tensor& beta2, double ridge,
                                                            double eps, double hz_divisor) {
  auto r = NcaiStatisticsFn::apply(x, mu, beta2, ridge, eps, hz_divisor);
  return {r[0], r[1], r[2]};
}

std::tuple<Tensor, Tensor, Tensor> ncai_statistics_cpu(const Tensor& x, const Tensor& mu,
                                                       const Tensor& beta2, double ridge, double eps,
                                                       double hz_divisor) {
  std::vector<Tensor> out = ncai_statistics(x, mu, beta2, ridge, eps, false, false, true);
  return {divided(out[0], hz_divisor), out[1], out[2]};
}

// NCAI's weighted penalty of the statistics (started: handle >= 0, else computed now, HZ and HSIC
// side by side on the intra-op pool) with the gradient of the penalty alone with respect to mu,
// without an autograd node: (penalty, hz, offdiag, hsic, d penalty / d mu). The numbers are those of
// the weighted node's outputs and of its backward pass from the penalty with seed 1 (the
// statistics' own outputs reaching no loss), computed by the same functions, so that a caller
// adding the gradient to mu's leaf after the rest of its backward pass gets the same bits as one
// backward pass through the node (autograd then adds the two gradients once, in either order).
std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor> ncai_penalty_gradient(const Tensor& x, const Tensor& mu,
                                                                         const Tensor& beta2, double ridge,
                                                                         double eps, double hz_divisor,
                                                                         std::vector<double> coeffs,
                                                                         std::vector<double> scales, int64_t handle) {
  const std::vector<Tensor> out = handle >= 0 ? take_pending(handle)
                                              : ncai_statistics(x.detach(), mu.detach(), beta2, ridge, eps, false,
                                                                true, true);
  TORCH_CHECK(out[5].numel() > 0, "ncai_penalty_gradient: the statistics were started without mu's gradient");
  const torch::autograd::variable_list stats = {divided(out[0], hz_divisor), out[1], out[2]};
  auto [value, slopes] = weighted_statistics(stats, coeffs, scales);
  const double none[3] = {0.0, 0.0, 0.0};  // the statistics' own outputs reach no loss; the penalty's seed is 1
  const Tensor dmu =
      std::get<1>(statistics_grads({out[3], out[4], out[5], out[6]}, false, true, hz_divisor, none, 1.0, slopes));
  return {at::scalar_tensor(value, stats[0].options()), stats[0], stats[1], stats[2], dmu};
}

// NCAI's weighted penalty sum_k c_k g_k(t_k) of 0-dim statistics t_k, g_k(t) = safe_exp(t / e_k)
// (exp, continued linearly beyond an exponent of 30) for e_k > 0 and t for e_k = 0, with the slopes
// c_k g_k'(t_k): the arithmetic of ncai._WeightedPenalty (double, from the statistics' values),
// which it replaces where the kernels are built, as one C++ autograd node (no Python in backward)
std::tuple<double, std::vector<double>> weighted_penalty_value(at::TensorList terms, at::ArrayRef<double> coeffs,
                                                               at::ArrayRef<double> scales) {
  TORCH_CHECK(terms.size() == coeffs.size() && terms.size() == scales.size() && !terms.empty(),
              "weighted_penalty: one coefficient and one scale per term");
  constexpr double cap = 30.0;
  double value = 0.0;
  std::vector<double> slopes;
  for (size_t k = 0; k < terms.size(); ++k) {
    const Tensor& term = terms[k];
    const bool direct = term.device().is_cpu() && term.numel() == 1;
    const double c = coeffs[k], e = scales[k];
    const double t = direct && term.scalar_type() == at::kFloat    ? double(*term.data_ptr<float>())
                     : direct && term.scalar_type() == at::kDouble ? *term.data_ptr<double>()
                                                                   : term.item<double>();
    if (e > 0) {
      const double u = t / e;
      double g, dg;
      if (u <= cap) {
        g = dg = std::exp(u);
      } else {
        dg = std::exp(cap);
        g = dg * (1.0 + u - cap);
      }
      value += c * g;
      slopes.push_back(c * dg / e);
    } else {
      value += c * t;
      slopes.push_back(c);
    }
  }
  return {value, slopes};
}

class WeightedPenaltyFn : public torch::autograd::Function<WeightedPenaltyFn> {
 public:
  static Tensor forward(torch::autograd::AutogradContext* ctx, at::TensorList terms, std::vector<double> coeffs,
                        std::vector<double> scales) {
    auto [value, slopes] = weighted_penalty_value(terms, coeffs, scales);
    ctx->saved_data["slopes"] = slopes;
    return at::scalar_tensor(value, terms[0].options());
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list g) {
    const std::vector<double> slopes = ctx->saved_data["slopes"].toDoubleVector();
    torch::autograd::variable_list out;
    for (double s : slopes) out.push_back(g[0] * s);
    out.emplace_back();  // coeffs
    out.emplace_back();  // scales
    return out;
  }
};

Tensor weighted_penalty_autograd(at::TensorList terms, at::ArrayRef<double> coeffs, at::ArrayRef<double> scales) {
  return WeightedPenaltyFn::apply(terms, coeffs.vec(), scales.vec());
}

Tensor weighted_penalty_cpu(at::TensorList terms, at::ArrayRef<double> coeffs, at::ArrayRef<double> scales) {
  return at::scalar_tensor(std::get<0>(weighted_penalty_value(terms, coeffs, scales)), terms[0].options());
}

}  // namespace

TORCH_LIBRARY(pyro_bnnlv_pairwise, m) {
  m.def("ncai_statistics(Tensor x, Tensor mu, Tensor beta2, float ridge, float eps, float hz_divisor=1.0) -> "
        "(Tensor, Tensor, Tensor)");
  m.def(
      "ncai_statistics_collect(Tensor x, Tensor mu, int handle, float hz_divisor, float[] coeffs, float[] scales) -> "
      "(Tensor, Tensor, Tensor, Tensor)");
  m.def(
      "ncai_statistics_weighted(Tensor x, Tensor mu, Tensor beta2, float ridge, float eps, float hz_divisor, "
      "float[] coeffs, float[] scales) -> (Tensor, Tensor, Tensor, Tensor)");
  m.def("weighted_penalty(Tensor[] terms, float[] coeffs, float[] scales) -> Tensor");
}
TORCH_LIBRARY_IMPL(pyro_bnnlv_pairwise, CPU, m) {
  m.impl("ncai_statistics", ncai_statistics_cpu);
  m.impl("ncai_statistics_collect", ncai_statistics_collect_cpu);
  m.impl("ncai_statistics_weighted", ncai_statistics_weighted_cpu);
  m.impl("weighted_penalty", weighted_penalty_cpu);
}
TORCH_LIBRARY_IMPL(pyro_bnnlv_pairwise, Autograd, m) {
  m.impl("ncai_statistics", ncai_statistics_autograd);
  m.impl("ncai_statistics_collect", ncai_statistics_collect_autograd);
  m.impl("ncai_statistics_weighted", ncai_statistics_weighted_autograd);
  m.impl("weighted_penalty", weighted_penalty_autograd);
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("henze_zirkler", &henze_zirkler, "Henze-Zirkler statistic and its gradient");
  m.def("offdiag_cov_norm", &offdiag_cov_norm, "off-diagonal covariance norm and its gradient");
  m.def("ncai_statistics", &ncai_statistics, "HZ, off-diagonal norm and nHSIC with gradients", py::arg("x"),
        py::arg("mu"), py::arg("beta2"), py::arg("ridge"), py::arg("eps"), py::arg("grad_x"), py::arg("grad_mu"),
        py::arg("parallel") = true);
  m.def(
      "exp_nonpositive",
      [](Tensor t) {
        TORCH_CHECK(t.scalar_type() == at::kFloat && t.is_contiguous(), "exp_nonpositive: a contiguous float tensor");
        Tensor out = t.clone();
        exp_nonpositive(out.data_ptr<float>(), out.numel());
        return out;
      },
      "the float exp of the packed kernels, for exponents <= 0");
  m.def("ncai_statistics_start", &ncai_statistics_start,
        "ncai_statistics started on the extension's worker thread; returns the handle to collect");
  m.def("ncai_statistics_discard", &ncai_statistics_discard, "wait for and drop started statistics");
  m.def("ncai_penalty_gradient", &ncai_penalty_gradient,
        "NCAI's weighted penalty of the started (handle >= 0) or computed statistics, and its gradient "
        "with respect to mu, without an autograd node");
  m.def("centred_alignment", &centred_alignment,
        "normalised HSIC of Gaussian Grams and its gradients");
}
