// Compiled core of pyro_bnnlv.infer.mcmc.nuts: the MLP potentials (regression and classification)
// and FlatNUTS's tree.
//
// Built on first use by pyro_bnnlv/_compiled.py (torch.utils.cpp_extension.load); the
// Python code in infer/mcmc/kernel.py is the reference implementation and the fallback when no compiler is
// available. Both compute the same quantities with the same operations, except that the C++
// sums the energy terms in double (the Python in the tensor's dtype) and does not fuse
// r + alpha * g, so float64 results agree to ~1e-14 and float32 energies to ~1e-5 relative:
//
//  * MLPPotential::value_and_grad mirrors nuts.mlp_regression_potential's value_and_grad:
//        U(w, z) = 1/(2 s^2) sum_n |f([x_n, z_n]; w) - y_n|^2 + 1/2 (w - m)' diag(prec) (w - m)
//                  + 1/2 sum_n z_n' diag(zprec) z_n + const
//    with a hand-written backward pass (tanh: in float32 a rational approximation, largest
//    error 3.4e-7; in float64 2 sigmoid(2a) - 1, as the Python code in both dtypes).
//    With likelihood = CATEGORICAL or BERNOULLI it mirrors models.potential.mlp_classification_potential:
//    the Gaussian term is replaced by the cross-entropy, and only it and its dL/df differ (same
//    forward and backward through the network):
//        categorical: -log p(y_n | f_n) = logsumexp_k f_nk - f_n,y_n,  dL/df_n = softmax(f_n) - onehot(y_n)
//        bernoulli:   -log p(y_n | f_n) = max(f, 0) - y f + log1p(exp(-|f|)),  dL/df_n = sigmoid(f_n) - y_n
//    (Y holds the one-hot rows / the 0/1 column; inv_var = 1).
//  * build_tree mirrors FlatNUTS._build_tree_flat (Pyro's NUTS._build_tree, multinomial
//    sampling): the same recursion, U-turn test, divergence threshold and the same Bernoulli
//    draw per merge from the chain's torch.Generator (torch's default generator when none is
//    given), so the random stream is that of torch.bernoulli.
//
// A tree on an MLPPotential runs without the GIL, so several chains (one thread each, each with
// its own MLPPotential.clone() and generator) advance in parallel; a tree calling a Python
// potential back holds the GIL.
// ATen and torch's pybind11 casters: what
// <torch/extension.h> offers minus the C++ frontend (torch/all.h), a third of the build time
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <torch/csrc/utils/pybind.h>
#include <torch/csrc/Generator.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/DistributionsHelper.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <tuple>
#include <vector>

namespace py = pybind11;
using at::Tensor;

namespace {

enum Activation { IDENTITY = 0, TANH = 1, RELU = 2, LEAKY_RELU = 3, SIGMOID = 4, RBF = 5, SILU = 6, GELU = 7, SOFTPLUS = 8 };
// softplus is a itself above this (torch.nn.functional.softplus's default threshold, beta = 1)
constexpr double kSoftplusThreshold = 20.0;
// the observation model (models/potential.py: _LIKELIHOOD_CODES)
enum Likelihood { GAUSSIAN = 0, CATEGORICAL = 1, BERNOULLI = 2 };

struct Layer {
  int64_t fan_in, fan_out, w_off, b_off;  // W (fan_out, fan_in) row-major at w_off, b at b_off
  Tensor A, H;                            // pre-activation and output buffers (hidden layers)
  Tensor S;                               // act'(A), kept by the forward pass (silu, gelu, softplus)
};

// ---------------------------------------------------------------------------------------------
// small dense products in plain loops, on the feature-major layout
// ---------------------------------------------------------------------------------------------
// Activations are stored feature-major: a layer's (N, F) activations as an (F, Np) row-major
// buffer, Np = N rounded up to a multiple of 8 (zero data in the padding), so that every inner
// loop runs over the data axis: contiguous, a whole number of 256-bit registers, no remainder.
// For the layers of NUTS on a BNN (1 x 50 on 100 or 409 points) these loops beat the BLAS calls
// and the transposes they needed (boston: 409 x 13 x 50 by at::addmm 8.4 us, here ~4 us).

// One vector register of VB bytes holding T as a GCC vector: VB = 32 (AVX2) in the AVX2+FMA
// build, 16 (SSE2) in the baseline build (32-byte vectors there ran 16x slower).
template <typename T, int VB>
struct Reg {
  typedef T type __attribute__((vector_size(VB)));
  static constexpr int W = VB / sizeof(T);
};
template <typename T, int VB>
using VecT = typename Reg<T, VB>::type;

template <typename T, int VB>
__attribute__((always_inline)) inline VecT<T, VB> vload(const T* p) {
  VecT<T, VB> v;
  __builtin_memcpy(&v, p, sizeof(v));
  return v;
}
template <typename T, int VB>
__attribute__((always_inline)) inline void vstore(T* p, VecT<T, VB> v) {
  __builtin_memcpy(p, &v, sizeof(v));
}
template <typename T, int VB>
__attribute__((always_inline)) inline T hsum(VecT<T, VB> v) {
  T s = T(0);
  for (int j = 0; j < Reg<T, VB>::W; ++j) s += v[j];
  return s;
}

// C[m, :] = bias[m] + sum_k A[m * a_m + k * a_k] B[k, :] for m < M (B: (Kd, Np), C: (M, Np);
// bias = nullptr: 0). Tiles of RM rows x R registers of columns whose accumulators stay in
// registers over the whole sum over k, each load of B serving RM rows.
template <typename T, int VB, int RM, int R>
__attribute__((always_inline)) inline void rows_tile(int64_t m, int64_t n0, int64_t Np, int64_t Kd, const T* A,
                                                     int64_t a_m, int64_t a_k, const T* B, T* C, const T* bias) {
  constexpr int W = Reg<T, VB>::W;
  VecT<T, VB> acc[RM][R];
  for (int i = 0; i < RM; ++i) {
    const T c = bias ? bias[m + i] : T(0);
    for (int r = 0; r < R; ++r) acc[i][r] = VecT<T, VB>{} + c;
  }
  for (int64_t k = 0; k < Kd; ++k) {
    VecT<T, VB> bk[R];
    for (int r = 0; r < R; ++r) bk[r] = vload<T, VB>(B + k * Np + n0 + r * W);
    for (int i = 0; i < RM; ++i) {
      const T a = A[(m + i) * a_m + k * a_k];
      for (int r = 0; r < R; ++r) acc[i][r] += a * bk[r];
    }
  }
  for (int i = 0; i < RM; ++i)
    for (int r = 0; r < R; ++r) vstore<T, VB>(C + (m + i) * Np + n0 + r * W, acc[i][r]);
}

template <typename T, int VB, int RM, int R>
__attribute__((always_inline)) inline int64_t rows_block(int64_t M, int64_t n0, int64_t Np, int64_t Kd, const T* A,
                                                         int64_t a_m, int64_t a_k, const T* B, T* C, const T* bias) {
  constexpr int W = Reg<T, VB>::W;
  for (; n0 + R * W <= Np; n0 += R * W) {
    int64_t m = 0;
    for (; m + RM <= M; m += RM) rows_tile<T, VB, RM, R>(m, n0, Np, Kd, A, a_m, a_k, B, C, bias);
    for (; m < M; ++m) rows_tile<T, VB, 1, R>(m, n0, Np, Kd, A, a_m, a_k, B, C, bias);
  }
  return n0;
}

// Tiles of 5 rows x 2 registers (10 accumulators, 2 loads and a broadcast per k: measured on
// boston's 50 x 13 x 416 at 4.4 us, about two FMAs per cycle, against 8 us for 1 x 4 and 4.9 for
// 4 x 2); fewer than 5 rows (the output layer) as 1 x 4, four independent chains over k.
template <typename T, int VB>
__attribute__((always_inline)) inline void rows_gemm(int64_t M, int64_t Np, int64_t Kd, const T* A, int64_t a_m,
                                                     int64_t a_k, const T* B, T* C, const T* bias) {
  // Np is a multiple of 8, so of a register's width: nothing is left after the last block
  int64_t n0 = M >= 5 ? rows_block<T, VB, 5, 2>(M, 0, Np, Kd, A, a_m, a_k, B, C, bias)
                      : rows_block<T, VB, 1, 4>(M, 0, Np, Kd, A, a_m, a_k, B, C, bias);
  rows_block<T, VB, 1, 1>(M, n0, Np, Kd, A, a_m, a_k, B, C, bias);
}

// G[o, k] = sum_n D[o, n] X[k, n] for o < M, k < Kd (D: (M, Np), X: (Kd, Np), G: (M, Kd)),
// in tiles of BO x BK dot products sharing their loads, one register of partial sums each (4 x 3:
// 5.4 us on boston's 50 x 13 x 416, against 6.4 for 3 x 3 and 8.1-8.9 for 4 x 2, 5 x 2, 2 x 5).
template <typename T, int VB, int BO, int BK>
__attribute__((always_inline)) inline void dots_tile(int64_t o, int64_t k, int64_t Np, int64_t Kd, const T* D,
                                                     const T* X, T* G) {
  constexpr int W = Reg<T, VB>::W;
  VecT<T, VB> acc[BO][BK];
  for (int a = 0; a < BO; ++a)
    for (int b = 0; b < BK; ++b) acc[a][b] = VecT<T, VB>{};
  for (int64_t n = 0; n < Np; n += W) {
    VecT<T, VB> xs[BK];
    for (int b = 0; b < BK; ++b) xs[b] = vload<T, VB>(X + (k + b) * Np + n);
    for (int a = 0; a < BO; ++a) {
      const VecT<T, VB> d = vload<T, VB>(D + (o + a) * Np + n);
      for (int b = 0; b < BK; ++b) acc[a][b] += d * xs[b];
    }
  }
  for (int a = 0; a < BO; ++a)
    for (int b = 0; b < BK; ++b) G[(o + a) * Kd + k + b] = hsum<T, VB>(acc[a][b]);
}

template <typename T, int VB, int BO>
__attribute__((always_inline)) inline void dots_rows(int64_t o, int64_t Np, int64_t Kd, const T* D, const T* X,
                                                     T* G) {
  int64_t k = 0;
  for (; k + 3 <= Kd; k += 3) dots_tile<T, VB, BO, 3>(o, k, Np, Kd, D, X, G);
  for (; k < Kd; ++k) dots_tile<T, VB, BO, 1>(o, k, Np, Kd, D, X, G);
}

template <typename T, int VB>
__attribute__((always_inline)) inline void dots(int64_t M, int64_t Kd, int64_t Np, const T* D, const T* X, T* G) {
  int64_t o = 0;
  for (; o + 4 <= M; o += 4) dots_rows<T, VB, 4>(o, Np, Kd, D, X, G);
  for (; o < M; ++o) dots_rows<T, VB, 1>(o, Np, Kd, D, X, G);
}

// s[m] = sum_n D[m, n] (D: (M, Np))
template <typename T, int VB>
__attribute__((always_inline)) inline void row_sums(int64_t M, int64_t Np, const T* D, T* s) {
  constexpr int W = Reg<T, VB>::W;
  for (int64_t m = 0; m < M; ++m) {
    VecT<T, VB> acc = VecT<T, VB>{};
    for (int64_t n = 0; n < Np; n += W) acc += vload<T, VB>(D + m * Np + n);
    s[m] = hsum<T, VB>(acc);
  }
}

// tanh in float32 as a rational function: Eigen's generic_fast_tanh_float (the one XLA, and so
// NumPyro on the CPU, uses): the odd degree-13 / even degree-6 minimax ratio on [-7.9, 7.9],
// clamped outside, x itself for |x| < 4e-4. Branch-free, so the loop vectorises; measured
// largest error over [-12, 12]: 3.4e-7 (absolute and relative). A NaN stays a NaN.
template <int VB>
__attribute__((always_inline)) inline void tanh_rational(const float* a, float* h, int64_t m) {
  typedef VecT<float, VB> V;
  const V hi = V{} + 7.90531110763549805f, lo = V{} - 7.90531110763549805f, tiny = V{} + 0.0004f;
  for (int64_t j = 0; j < m; j += Reg<float, VB>::W) {  // m is a multiple of 8 (padded rows)
    const V v = vload<float, VB>(a + j);
    V x = v > hi ? hi : v;  // a NaN compares false, so it stays
    x = x < lo ? lo : x;
    const V x2 = x * x;
    V p = x2 * -2.76076847742355e-16f + 2.00018790482477e-13f;
    p = x2 * p + -8.60467152213735e-11f;
    p = x2 * p + 5.12229709037114e-08f;
    p = x2 * p + 1.48572235717979e-05f;
    p = x2 * p + 6.37261928875436e-04f;
    p = x2 * p + 4.89352455891786e-03f;
    p = x * p;
    V q = x2 * 1.19825839466702e-06f + 1.18534705686654e-04f;
    q = x2 * q + 2.26843463243900e-03f;
    q = x2 * q + 4.89352518554385e-03f;
    const V r = p / q;
    const V av = v < V{} ? -v : v;
    vstore<float, VB>(h + j, av < tiny ? v : r);
  }
}

// ---------------------------------------------------------------------------------------------
// the potential of an MLP: regression (Gaussian) or classification (categorical, Bernoulli)
// ---------------------------------------------------------------------------------------------
class MLPPotential {
 public:
  // layers: (fan_in, fan_out, weight offset, bias offset) per layer, in net.layers order.
  // xin: (N, D + K) inputs with K trailing columns for z; Y: (N, L) targets (classification:
  // one-hot rows, or the 0/1 column for Bernoulli); likelihood: enum Likelihood.
  MLPPotential(Tensor xin, Tensor Y, std::vector<std::tuple<int64_t, int64_t, int64_t, int64_t>> layers,
               int64_t activation, Tensor loc, Tensor prec, bool has_loc, double inv_var,
               double constant, int64_t latent_dim, Tensor zprec, int64_t likelihood = GAUSSIAN)
      : xin_(xin.contiguous().clone()), Y_(Y.contiguous()), loc_(loc.contiguous()),
        prec_(prec.contiguous()), zprec_(zprec.contiguous()), act_(activation), lik_(likelihood),
        has_loc_(has_loc), inv_var_(inv_var), const_(constant), K_(latent_dim), specs_(layers) {
    TORCH_CHECK(xin_.dim() == 2 && Y_.dim() == 2 && xin_.size(0) == Y_.size(0),
                "MLPPotential: xin must be (N, D+K) and Y (N, L)");
    TORCH_CHECK(activation >= IDENTITY && activation <= SOFTPLUS, "MLPPotential: unknown activation code");
    TORCH_CHECK(likelihood >= GAUSSIAN && likelihood <= BERNOULLI, "MLPPotential: unknown likelihood code");
    TORCH_CHECK(latent_dim >= 0 && latent_dim <= xin_.size(1), "MLPPotential: latent_dim out of range");
    for (const Tensor* t : {&Y_, &loc_, &prec_, &zprec_}) {
      TORCH_CHECK(t->device().is_cpu() && t->scalar_type() == xin_.scalar_type(),
                  "MLPPotential: all tensors must be CPU tensors of xin's dtype");
    }
    TORCH_CHECK(xin_.device().is_cpu(), "MLPPotential: xin must be a CPU tensor");
    TORCH_CHECK(xin_.scalar_type() == at::kFloat || xin_.scalar_type() == at::kDouble,
                "MLPPotential: only float32 and float64 are supported");
    N_ = xin_.size(0);
    D_ = xin_.size(1) - K_;
    P_ = loc_.numel();
    TORCH_CHECK(loc_.dim() == 1 && prec_.dim() == 1 && prec_.numel() == P_,
                "MLPPotential: loc and prec must be (P,)");
    TORCH_CHECK(zprec_.dim() == 1 && zprec_.numel() == K_, "MLPPotential: zprec must be (K,)");
    auto opts = xin_.options();
    Np_ = (N_ + 7) / 8 * 8;
    gbuf_ = at::zeros({P_}, opts);
    int64_t widest = std::max<int64_t>(1, K_);
    for (size_t i = 0; i < layers.size(); ++i) {
      auto [fi, fo, w_off, b_off] = layers[i];
      TORCH_CHECK(fi > 0 && fo > 0 && w_off >= 0 && b_off >= 0 && w_off + fi * fo <= P_ && b_off + fo <= P_,
                  "MLPPotential: layer ", i, " does not fit in the ", P_, " weights");
      TORCH_CHECK(i > 0 || fi == xin_.size(1), "MLPPotential: the first layer's fan_in must be D + K");
      TORCH_CHECK(i == 0 || fi == layers_.back().fan_out, "MLPPotential: layer ", i, "'s fan_in must match");
      Layer l;
      l.fan_in = fi;
      l.fan_out = fo;
      l.w_off = w_off;
      l.b_off = b_off;
      if (i > 0) widest = std::max(widest, fi);
      if (i + 1 < layers.size()) {  // feature-major (fo, Np) buffers
        l.A = at::zeros({fo, Np_}, opts);
        l.H = at::zeros({fo, Np_}, opts);
        if (activation == SILU || activation == GELU || activation == SOFTPLUS) l.S = at::zeros({fo, Np_}, opts);
      }
      layers_.push_back(l);
    }
    TORCH_CHECK(!layers_.empty() && layers_.back().fan_out == Y_.size(1),
                "MLPPotential: the last layer's width must equal Y's columns");
    const int64_t L = Y_.size(1);
    TORCH_CHECK(lik_ != CATEGORICAL || L >= 2, "MLPPotential: the categorical likelihood needs K >= 2 outputs");
    TORCH_CHECK(lik_ != BERNOULLI || L == 1, "MLPPotential: the bernoulli likelihood needs one output");
    // the inputs and targets feature-major, zero in the padding columns
    xT_ = at::zeros({xin_.size(1), Np_}, opts);
    xT_.narrow(1, 0, N_).copy_(xin_.t());
    YT_ = at::zeros({L, Np_}, opts);
    YT_.narrow(1, 0, N_).copy_(Y_.t());
    res_ = at::zeros({L, Np_}, opts);
    if (lik_ == CATEGORICAL) scratch_ = at::zeros({3 * Np_}, opts);
    dh_[0] = at::zeros({widest * Np_}, opts);
    dh_[1] = at::zeros({widest * Np_}, opts);
  }

  int64_t dim() const { return P_ + N_ * K_; }

  // An independent copy (same data, its own work buffers) for another thread.
  MLPPotential clone() const {
    return MLPPotential(xin_, Y_, specs_, act_, loc_, prec_, has_loc_, inv_var_, const_, K_, zprec_, lik_);
  }

  std::tuple<double, Tensor> value_and_grad(const Tensor& q) {
    TORCH_CHECK(q.dim() == 1 && q.numel() == dim(), "value_and_grad: q must have shape (", dim(), ",)");
    TORCH_CHECK(q.scalar_type() == xin_.scalar_type(), "value_and_grad: q has dtype ", q.scalar_type(),
                ", the potential ", xin_.scalar_type());
    at::NoGradGuard no_grad;
    Tensor qc = q.contiguous();
    if (qc.scalar_type() == at::kDouble) return compute<double>(qc);
    TORCH_CHECK(qc.scalar_type() == at::kFloat, "value_and_grad: only float32 and float64 are supported");
    return compute<float>(qc);
  }

 private:
  // The value and gradient in plain loops over raw pointers on the feature-major layout (no
  // ATen dispatch except, in float64 or for sigmoid / rbf / silu / gelu / softplus, one to three
  // elementwise calls per hidden layer):
  // for the small layers of NUTS on a BNN (100 x 50, 409 x 13 x 50) the per-operation overhead
  // of ATen (~1-10 us per addmm / sum) exceeded the arithmetic. Every inner loop runs over the
  // contiguous, padded data axis (vectorised by the compiler; compiled twice, for AVX2+FMA and
  // for the baseline ISA, chosen at run time).
  template <typename T>
  std::tuple<double, Tensor> compute(const Tensor& q) {
    Tensor g = at::empty({dim()}, q.options());
    double u;
    if (cpu_has_avx2_fma())
      u = compute_avx2<T>(q.data_ptr<T>(), g.data_ptr<T>());
    else
      u = compute_generic<T>(q.data_ptr<T>(), g.data_ptr<T>());
    return {u, g};
  }

  // PYRO_BNNLV_BASELINE_ISA=1 forces the baseline build (tests run it on AVX2 machines too)
  static bool cpu_has_avx2_fma() {
    static const bool yes = std::getenv("PYRO_BNNLV_BASELINE_ISA") == nullptr &&
                            __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    return yes;
  }

  template <typename T>
  __attribute__((target("avx2,fma"))) double compute_avx2(const T* q, T* g) { return compute_impl<T, 32>(q, g); }

  template <typename T>
  double compute_generic(const T* q, T* g) { return compute_impl<T, 16>(q, g); }

  template <typename T, int VB>
  __attribute__((always_inline)) inline double compute_impl(const T* q, T* gout) {
    const size_t last = layers_.size() - 1;
    const int64_t Np = Np_;
    T* xT = xT_.data_ptr<T>();
    if (K_ > 0) {  // the latent inputs z (N, K) go into the trailing rows of x^T
      const T* z = q + P_;
      for (int64_t k = 0; k < K_; ++k)
        for (int64_t n = 0; n < N_; ++n) xT[(D_ + k) * Np + n] = z[n * K_ + k];
    }
    // forward, feature-major: out (fo, Np) = W (fo, fi) h (fi, Np) + b
    const T* h = xT;
    T* out = nullptr;
    for (size_t i = 0; i <= last; ++i) {
      Layer& l = layers_[i];
      const int64_t fi = l.fan_in, fo = l.fan_out;
      out = i == last ? res_.data_ptr<T>() : l.A.data_ptr<T>();
      rows_gemm<T, VB>(fo, Np, fi, q + l.w_off, fi, 1, h, out, q + l.b_off);
      if (i == last) break;
      T* H = l.H.data_ptr<T>();
      const int64_t m = fo * Np;
      switch (act_) {
        case TANH: {
          if constexpr (std::is_same_v<T, float>) {
            tanh_rational<VB>(out, H, m);
          } else {  // float64: 2 sigmoid(2a) - 1 with torch's vectorised sigmoid (its tanh is slower)
            Tensor a2 = l.A * 2;
            at::sigmoid_out(l.H, a2);
            for (int64_t j = 0; j < m; ++j) H[j] = T(2) * H[j] - T(1);
          }
          break;
        }
        case SIGMOID: at::sigmoid_out(l.H, l.A); break;
        case IDENTITY: for (int64_t j = 0; j < m; ++j) H[j] = out[j]; break;
        case RELU: for (int64_t j = 0; j < m; ++j) H[j] = out[j] > T(0) ? out[j] : T(0); break;
        case LEAKY_RELU: for (int64_t j = 0; j < m; ++j) H[j] = out[j] > T(0) ? out[j] : T(0.01) * out[j]; break;
        case RBF: {
          for (int64_t j = 0; j < m; ++j) H[j] = -out[j] * out[j];
          l.H.exp_();
          break;
        }
        // the three below keep S = act'(a) for the backward pass (_mlp_kernels.py has the formulas)
        case SILU: {  // h = a s, s = sigmoid(a); silu'(a) = s (1 + a (1 - s))
          at::sigmoid_out(l.S, l.A);
          T* S = l.S.data_ptr<T>();
          for (int64_t j = 0; j < m; ++j) {
            const T s = S[j], a = out[j];
            H[j] = a * s;
            S[j] = s * (T(1) + a * (T(1) - s));
          }
          break;
        }
        case GELU: {  // h = a Phi(a); gelu'(a) = Phi(a) + a phi(a), phi(a) = exp(-a^2 / 2) / sqrt(2 pi)
          at::erf_out(l.S, l.A * M_SQRT1_2);
          at::exp_out(l.H, l.A.square() * -0.5);  // phi's exponential, overwritten by h below
          T* S = l.S.data_ptr<T>();
          const T inv_sqrt_2pi = T(0.3989422804014327);
          for (int64_t j = 0; j < m; ++j) {
            const T a = out[j], cdf = T(0.5) * (T(1) + S[j]);
            S[j] = cdf + a * (H[j] * inv_sqrt_2pi);
            H[j] = a * cdf;
          }
          break;
        }
        case SOFTPLUS: {  // h = log1p(exp(a)) (a above the threshold); softplus'(a) = sigmoid(a) (1 above it)
          at::softplus_out(l.H, l.A, 1, kSoftplusThreshold);
          at::sigmoid_out(l.S, l.A);
          T* S = l.S.data_ptr<T>();
          for (int64_t j = 0; j < m; ++j) S[j] = out[j] > T(kSoftplusThreshold) ? T(1) : S[j];
          break;
        }
      }
      h = H;
    }
    // the data term and delta = c dL/df in place of f (zero in the padding)
    T* delta = out;
    double u = likelihood_term<T>(delta);
    // backward: likelihood gradient (times c: s^2 for the Gaussian, else 1) into gbuf in the weights' layout; delta is
    // dL/d(pre-activation) of the current layer, (fo, Np), zero in the padding
    T* glik = gbuf_.data_ptr<T>();
    T* dh_buf[2] = {dh_[0].data_ptr<T>(), dh_[1].data_ptr<T>()};
    int flip = 0;
    for (size_t ii = layers_.size(); ii-- > 0;) {
      const Layer& l = layers_[ii];
      const int64_t fi = l.fan_in, fo = l.fan_out;
      const T* hin = ii == 0 ? xT : layers_[ii - 1].H.data_ptr<T>();
      row_sums<T, VB>(fo, Np, delta, glik + l.b_off);
      dots<T, VB>(fo, fi, Np, delta, hin, glik + l.w_off);  // gW (fo, fi) = delta h^T
      if (ii == 0) break;
      // dL/dh (fi, Np) = W^T delta, then through the activation of the layer below
      T* dh = dh_buf[flip];
      flip ^= 1;
      rows_gemm<T, VB>(fi, Np, fo, q + l.w_off, 1, fi, delta, dh, nullptr);
      const Layer& prev = layers_[ii - 1];
      const T* hp = prev.H.data_ptr<T>();
      const int64_t m = fi * Np;
      switch (act_) {
        case IDENTITY: break;
        case TANH: for (int64_t j = 0; j < m; ++j) dh[j] = dh[j] - dh[j] * (hp[j] * hp[j]); break;
        case RELU: for (int64_t j = 0; j < m; ++j) dh[j] = hp[j] > T(0) ? dh[j] : T(0); break;
        case LEAKY_RELU: for (int64_t j = 0; j < m; ++j) dh[j] = hp[j] > T(0) ? dh[j] : T(0.01) * dh[j]; break;
        case SIGMOID: for (int64_t j = 0; j < m; ++j) dh[j] = dh[j] * hp[j] - (dh[j] * hp[j]) * hp[j]; break;
        case RBF: {
          const T* ap = prev.A.data_ptr<T>();
          for (int64_t j = 0; j < m; ++j) dh[j] *= T(-2) * ap[j] * hp[j];
          break;
        }
        case SILU:
        case GELU:
        case SOFTPLUS: {  // act'(a), kept by the forward pass
          const T* sp = prev.S.data_ptr<T>();
          for (int64_t j = 0; j < m; ++j) dh[j] *= sp[j];
          break;
        }
      }
      delta = dh;
    }
    // prior of w and the full gradient
    const T* lp = loc_.data_ptr<T>();
    const T* pp = prec_.data_ptr<T>();
    const T iv = T(inv_var_);
    double quad = 0.0;
    if (has_loc_) {
#pragma omp simd reduction(+ : quad)
      for (int64_t j = 0; j < P_; ++j) {
        const T d = q[j] - lp[j];
        const T pd = pp[j] * d;
        quad += double(pd) * double(d);
        gout[j] = pd + iv * glik[j];
      }
    } else {
#pragma omp simd reduction(+ : quad)
      for (int64_t j = 0; j < P_; ++j) {
        const T pd = pp[j] * q[j];
        quad += double(pd) * double(q[j]);
        gout[j] = pd + iv * glik[j];
      }
    }
    u += 0.5 * quad + const_;
    if (K_ > 0) {  // z: its prior, and the likelihood through the first layer's z columns
      const T* zp = q + P_;
      const T* zpr = zprec_.data_ptr<T>();
      T* gz = gout + P_;
      const Layer& l0 = layers_[0];
      const int64_t Din = D_ + K_;
      // dL/dz^T (K, Np) = W0[:, D:]^T delta0
      T* dz = dh_buf[flip];
      rows_gemm<T, VB>(K_, Np, l0.fan_out, q + l0.w_off + D_, 1, Din, delta, dz, nullptr);
      double zquad = 0.0;
      for (int64_t n = 0; n < N_; ++n)
        for (int64_t k = 0; k < K_; ++k) {
          const T v = zp[n * K_ + k] * zpr[k];
          zquad += double(v) * double(zp[n * K_ + k]);
          gz[n * K_ + k] = v + iv * dz[k * Np + n];
        }
      u += 0.5 * zquad;
    }
    return u;
  }

  // The likelihood term -log p(y | f) from the outputs f (L, Np), feature-major, which it
  // overwrites with delta = c dL/df, zero in the padding columns:
  //  * GAUSSIAN: u = 1/(2 s^2) sum |f - y|^2 and the residual delta = f - y (c = s^2: the 1/s^2
  //    is applied once at the end, to the weight gradient);
  //  * CATEGORICAL: u = sum_n (m_n + log sum_k exp(f_nk - m_n) - f_n,y_n) with m_n = max_k f_nk
  //    (no exp overflows), delta = softmax(f_n) - onehot(y_n) (c = 1);
  //  * BERNOULLI: u = sum_n max(f_n, 0) - y_n f_n + log1p(exp(-|f_n|)), delta = sigmoid(f_n) - y_n,
  //    the sigmoid from the same exp(-|f|) (c = 1).
  // Loops run over the data axis (the rows of one output), the energy summed in double.
  template <typename T>
  __attribute__((always_inline)) inline double likelihood_term(T* f) {
    const T* YT = YT_.data_ptr<T>();
    const int64_t L = layers_.back().fan_out, Np = Np_;
    double u = 0.0;
    switch (lik_) {
      case GAUSSIAN: {
        for (int64_t o = 0; o < L; ++o) {
          T* d = f + o * Np;
          const T* y = YT + o * Np;
#pragma omp simd reduction(+ : u)
          for (int64_t n = 0; n < N_; ++n) {
            d[n] -= y[n];
            u += double(d[n]) * double(d[n]);
          }
        }
        u *= 0.5 * inv_var_;
        break;
      }
      case CATEGORICAL: {
        T* mx = scratch_.data_ptr<T>();  // max_k f_nk, then log-sum-exp
        T* se = mx + Np;                 // sum_k exp(f_nk - m_n), then its inverse
        T* yf = se + Np;                 // f_n,y_n
        for (int64_t n = 0; n < N_; ++n) {
          mx[n] = f[n];
          se[n] = T(0);
          yf[n] = T(0);
        }
        for (int64_t o = 0; o < L; ++o) {
          const T* fo = f + o * Np;
          const T* y = YT + o * Np;
          for (int64_t n = 0; n < N_; ++n) {
            mx[n] = fo[n] > mx[n] ? fo[n] : mx[n];
            yf[n] += y[n] * fo[n];  // a one-hot row: adds f_n,y_n and zeros
          }
        }
        for (int64_t o = 0; o < L; ++o) {
          T* fo = f + o * Np;
          for (int64_t n = 0; n < N_; ++n) {
            fo[n] = std::exp(fo[n] - mx[n]);
            se[n] += fo[n];
          }
        }
        for (int64_t n = 0; n < N_; ++n) {
          u += double(mx[n]) + std::log(double(se[n])) - double(yf[n]);
          se[n] = T(1) / se[n];
        }
        for (int64_t o = 0; o < L; ++o) {
          T* fo = f + o * Np;
          const T* y = YT + o * Np;
          for (int64_t n = 0; n < N_; ++n) fo[n] = fo[n] * se[n] - y[n];
        }
        break;
      }
      case BERNOULLI: {
        const T* y = YT;
        for (int64_t n = 0; n < N_; ++n) {
          const T a = f[n];
          const T e = std::exp(-std::abs(a));
          u += double(a > T(0) ? a : T(0)) - double(y[n]) * double(a) + std::log1p(double(e));
          const T p = a >= T(0) ? T(1) / (T(1) + e) : e / (T(1) + e);
          f[n] = p - y[n];
        }
        break;
      }
    }
    for (int64_t o = 0; o < L; ++o)
      for (int64_t n = N_; n < Np; ++n) f[o * Np + n] = T(0);
    return u;
  }

  Tensor xin_, Y_, loc_, prec_, zprec_, gbuf_;
  Tensor xT_, YT_, res_, dh_[2];  // feature-major (., Np): x^T (z in its last K rows), Y^T, the residual, dL/dh
  Tensor scratch_;                // categorical: three (Np,) rows for the log-sum-exp
  std::vector<Layer> layers_;
  int64_t act_, lik_;
  bool has_loc_;
  double inv_var_, const_;
  int64_t N_ = 0, D_ = 0, K_ = 0, P_ = 0, Np_ = 0;
  std::vector<std::tuple<int64_t, int64_t, int64_t, int64_t>> specs_;
};

// ---------------------------------------------------------------------------------------------
// NUTS tree (Pyro's NUTS._build_tree with multinomial sampling)
// ---------------------------------------------------------------------------------------------
struct Tree {
  Tensor ql, rl, ul, gl, qr, rr, ur, gr, qp;
  double pep;
  Tensor gp, rsum;
  double weight;
  bool turning, diverging;
  double sum_accept;
  int64_t num_proposals;
};

double logaddexp(double x, double y) {  // as nuts._logaddexp
  const double lo = x < y ? x : y, hi = x < y ? y : x;
  return std::log1p(std::exp(lo - hi)) + hi;
}

template <typename T>
class TreeBuilder {
 public:
  TreeBuilder(py::object potential, double step_size, double max_sliced_energy, double energy_current,
              Tensor minv, Tensor sqrt_inv, bool diag, at::CPUGeneratorImpl* gen)
      : step_size_(step_size), max_sliced_(max_sliced_energy), energy_current_(energy_current),
        minv_(minv.contiguous()), sqrt_inv_(sqrt_inv.contiguous()), diag_(diag), gen_(gen) {
    if (py::isinstance<MLPPotential>(potential))
      mlp_ = potential.cast<MLPPotential*>();
    else
      py_potential_ = potential;
  }

  bool compiled_potential() const { return mlp_ != nullptr; }

  Tree build(const Tensor& q, const Tensor& r, const Tensor& g, int direction, int64_t depth) {
    if (depth == 0) return base(q, r, g, direction);
    Tree half = build(q, r, g, direction, depth - 1);
    if (half.turning || half.diverging) return half;
    Tree other = direction == 1 ? build(half.qr, half.rr, half.gr, direction, depth - 1)
                                : build(half.ql, half.rl, half.gl, direction, depth - 1);
    const Tree& left = direction == 1 ? half : other;
    const Tree& right = direction == 1 ? other : half;
    Tree out;
    out.weight = logaddexp(half.weight, other.weight);
    out.rsum = at::empty_like(half.rsum);
    {
      T* s = out.rsum.data_ptr<T>();
      const T* a = half.rsum.data_ptr<T>();
      const T* b = other.rsum.data_ptr<T>();
      const int64_t n = out.rsum.numel();
      for (int64_t j = 0; j < n; ++j) s[j] = a[j] + b[j];
    }
    // the same draw as pyro.sample("is_other_half_tree", dist.Bernoulli(probs=p_other)), i.e.
    // torch.bernoulli of a 0-dim tensor of q's dtype holding p_other (ATen's CPU kernel: one
    // uniform from the generator, compared with p), without the tensor round trip
    const double p_other = std::exp(other.weight - out.weight);
    const bool take_other = bernoulli(p_other);
    const Tree& prop = take_other ? other : half;
    out.turning = other.turning || is_turning(left.ul, right.ur, out.rsum);
    out.ql = left.ql; out.rl = left.rl; out.ul = left.ul; out.gl = left.gl;
    out.qr = right.qr; out.rr = right.rr; out.ur = right.ur; out.gr = right.gr;
    out.qp = prop.qp; out.pep = prop.pep; out.gp = prop.gp;
    out.diverging = other.diverging;
    out.sum_accept = half.sum_accept + other.sum_accept;
    out.num_proposals = half.num_proposals + other.num_proposals;
    return out;
  }

  bool is_turning(const Tensor& ul, const Tensor& ur, const Tensor& rsum) const {
    const T* a = ul.data_ptr<T>();
    const T* b = ur.data_ptr<T>();
    const T* s = rsum.data_ptr<T>();
    const int64_t n = rsum.numel();
    T left = 0, right = 0;
    for (int64_t j = 0; j < n; ++j) {
      const T rho = s[j] + T(-0.5) * (a[j] + b[j]);
      left += a[j] * rho;
      right += b[j] * rho;
    }
    return left <= 0 || right <= 0;
  }

 private:
  std::tuple<double, Tensor> potential(const Tensor& q) {
    if (mlp_ != nullptr) return mlp_->value_and_grad(q);
    py::tuple res = py_potential_(q);
    Tensor g = res[1].cast<Tensor>().contiguous();
    TORCH_CHECK(g.sizes() == q.sizes() && g.scalar_type() == q.scalar_type(),
                "the potential's gradient must have the shape and dtype of q");
    return {py::float_(res[0]).cast<double>(), g};
  }

  Tree base(const Tensor& q, const Tensor& r, const Tensor& g, int direction) {
    const double eps = direction == 1 ? step_size_ : -step_size_;
    const int64_t n = q.numel();
    const T half_eps = T(-0.5 * eps), eps_t = T(eps);
    Tensor r1 = at::empty_like(r), q1 = at::empty_like(q);
    T* r1p = r1.data_ptr<T>();
    T* q1p = q1.data_ptr<T>();
    const T* rp = r.data_ptr<T>();
    const T* gp = g.data_ptr<T>();
    const T* qp = q.data_ptr<T>();
    for (int64_t j = 0; j < n; ++j) r1p[j] = rp[j] + half_eps * gp[j];
    if (diag_) {
      const T* m = minv_.data_ptr<T>();
      for (int64_t j = 0; j < n; ++j) q1p[j] = qp[j] + eps_t * m[j] * r1p[j];
    } else {
      Tensor v = at::mv(minv_, r1);
      const T* vp = v.data_ptr<T>();
      for (int64_t j = 0; j < n; ++j) q1p[j] = qp[j] + eps_t * vp[j];
    }
    double pe;
    Tensor g1;
    std::tie(pe, g1) = potential(q1);
    const T* g1p = g1.data_ptr<T>();
    for (int64_t j = 0; j < n; ++j) r1p[j] += half_eps * g1p[j];
    Tensor u;
    if (diag_) {
      u = at::empty_like(r1);
      T* up = u.data_ptr<T>();
      const T* s = sqrt_inv_.data_ptr<T>();
      for (int64_t j = 0; j < n; ++j) up[j] = s[j] * r1p[j];
    } else {
      u = at::mv(sqrt_inv_, r1);
    }
    const T* up = u.data_ptr<T>();
    T uu = 0;
    for (int64_t j = 0; j < n; ++j) uu += up[j] * up[j];
    double energy_new = pe + 0.5 * double(uu);
    if (std::isnan(energy_new)) energy_new = std::numeric_limits<double>::infinity();
    const double delta = energy_new - energy_current_;
    Tree t;
    t.ql = t.qr = t.qp = q1;
    t.rl = t.rr = r1;
    t.ul = t.ur = t.rsum = u;
    t.gl = t.gr = t.gp = g1;
    t.pep = pe;
    t.weight = -delta;
    t.turning = false;
    t.diverging = delta > max_sliced_;
    t.sum_accept = delta <= 0 ? 1.0 : std::exp(-delta);
    t.num_proposals = 1;
    return t;
  }

  bool bernoulli(double p) {
    std::lock_guard<std::mutex> lock(gen_->mutex_);
    if constexpr (std::is_same_v<T, double>) {
      at::bernoulli_distribution<double> draw(p);
      return draw(gen_) != 0;
    } else {
      at::bernoulli_distribution<float> draw(static_cast<float>(p));
      return draw(gen_) != 0;
    }
  }

  MLPPotential* mlp_ = nullptr;
  py::object py_potential_;
  double step_size_, max_sliced_, energy_current_;
  Tensor minv_, sqrt_inv_;
  bool diag_;
  at::CPUGeneratorImpl* gen_;
};

py::tuple to_tuple(const Tree& t) {
  return py::make_tuple(t.ql, t.rl, t.ul, t.gl, t.qr, t.rr, t.ur, t.gr, t.qp, t.pep, t.gp, t.rsum,
                        t.weight, t.turning, t.diverging, t.sum_accept, t.num_proposals);
}

at::CPUGeneratorImpl* cpu_generator(const py::object& generator) {
  if (generator.is_none()) return at::check_generator<at::CPUGeneratorImpl>(at::detail::getDefaultCPUGenerator());
  TORCH_CHECK(THPGenerator_Check(generator.ptr()), "build_tree: generator must be a torch.Generator or None");
  const at::Generator& gen = reinterpret_cast<THPGenerator*>(generator.ptr())->cdata;
  TORCH_CHECK(gen.device().is_cpu(), "build_tree: generator must be a CPU generator");
  return at::check_generator<at::CPUGeneratorImpl>(gen);
}

template <typename T>
py::tuple build_typed(py::object potential, const Tensor& q, const Tensor& r, const Tensor& g, int direction,
                      int64_t depth, double energy_current, double step_size, double max_sliced_energy,
                      const Tensor& minv, const Tensor& sqrt_inv, bool diag, const py::object& generator) {
  TreeBuilder<T> b(potential, step_size, max_sliced_energy, energy_current, minv, sqrt_inv, diag,
                   cpu_generator(generator));
  if (!b.compiled_potential()) return to_tuple(b.build(q, r, g, direction, depth));
  Tree t;
  {
    py::gil_scoped_release no_gil;  // other chains' threads run meanwhile
    at::NoGradGuard no_grad;        // grad mode is thread-local
    t = b.build(q, r, g, direction, depth);
  }
  return to_tuple(t);
}

// One (sub)tree of `depth` doublings from (q, r, g) in `direction` (1 forward, 0 backward), as
// the 17-field tuple of nuts.FlatNUTS._build_tree_flat. `generator` (a torch.Generator, or None
// for torch's default generator) supplies the per-merge Bernoulli draws.
py::tuple build_tree(py::object potential, Tensor q, Tensor r, Tensor g, int direction, int64_t depth,
                     double energy_current, double step_size, double max_sliced_energy, Tensor minv,
                     Tensor sqrt_inv, bool diag, py::object generator) {
  at::NoGradGuard no_grad;
  TORCH_CHECK(q.dim() == 1 && r.sizes() == q.sizes() && g.sizes() == q.sizes(),
              "build_tree: q, r and g must be vectors of one length");
  TORCH_CHECK(q.is_contiguous() && r.is_contiguous() && g.is_contiguous(),
              "build_tree: q, r and g must be contiguous");
  const int64_t n = q.numel();
  TORCH_CHECK(diag ? (minv.dim() == 1 && minv.numel() == n && sqrt_inv.dim() == 1 && sqrt_inv.numel() == n)
                   : (minv.dim() == 2 && minv.size(0) == n && minv.size(1) == n && sqrt_inv.dim() == 2 &&
                      sqrt_inv.size(0) == n && sqrt_inv.size(1) == n),
              "build_tree: the mass matrix must be (D,) with diag=True or (D, D) with diag=False");
  for (const Tensor* t : {&q, &r, &g, &minv, &sqrt_inv})
    TORCH_CHECK(t->device().is_cpu(), "build_tree: all tensors must be on the CPU");
  TORCH_CHECK(depth >= 0, "build_tree: depth must be non-negative");
  TORCH_CHECK(direction == 0 || direction == 1, "build_tree: direction must be 0 or 1");
  TORCH_CHECK(q.scalar_type() == r.scalar_type() && q.scalar_type() == g.scalar_type() &&
                  q.scalar_type() == minv.scalar_type(),
              "build_tree: q, r, g and the mass matrix must share a dtype");
  TORCH_CHECK(sqrt_inv.scalar_type() == q.scalar_type(), "build_tree: sqrt_inv must have q's dtype");
  if (q.scalar_type() == at::kDouble)
    return build_typed<double>(potential, q, r, g, direction, depth, energy_current, step_size, max_sliced_energy,
                               minv, sqrt_inv, diag, generator);
  TORCH_CHECK(q.scalar_type() == at::kFloat, "build_tree: only float32 and float64 are supported");
  return build_typed<float>(potential, q, r, g, direction, depth, energy_current, step_size, max_sliced_energy,
                            minv, sqrt_inv, diag, generator);
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "Compiled core of pyro_bnnlv's FlatNUTS (see pyro_bnnlv/_compiled.py)";
  py::class_<MLPPotential>(m, "MLPPotential")
      .def(py::init<Tensor, Tensor, std::vector<std::tuple<int64_t, int64_t, int64_t, int64_t>>, int64_t,
                    Tensor, Tensor, bool, double, double, int64_t, Tensor, int64_t>(),
           py::arg("xin"), py::arg("Y"), py::arg("layers"), py::arg("activation"), py::arg("loc"), py::arg("prec"),
           py::arg("has_loc"), py::arg("inv_var"), py::arg("constant"), py::arg("latent_dim"), py::arg("zprec"),
           py::arg("likelihood") = int64_t(GAUSSIAN))
      .def("value_and_grad", &MLPPotential::value_and_grad)
      .def("clone", &MLPPotential::clone)
      .def_property_readonly("dim", &MLPPotential::dim);
  m.def("build_tree", &build_tree, py::arg("potential"), py::arg("q"), py::arg("r"), py::arg("g"),
        py::arg("direction"), py::arg("depth"), py::arg("energy_current"), py::arg("step_size"),
        py::arg("max_sliced_energy"), py::arg("minv"), py::arg("sqrt_inv"), py::arg("diag"),
        py::arg("generator") = py::none());
}
