// Kernels of the CUDA device (package cudadev), compiled by NVRTC at start-up.
//
// Each kernel computes one output element (or one row or column) per thread,
// in a grid-stride loop, and sums in the order the reference loop in
// gpu/device.go fixes, so results are deterministic without atomics and
// match the CPU device bit for bit except where a transcendental function
// (erfcf, expf, exp, log) is involved. The source must also compile as C++ on
// the host (see cudatest's emulation prelude): no shared memory, no
// __syncthreads, no headers.

typedef long long ll;
typedef unsigned long long u64;

#define LOOP(i, n) for (ll i = (ll)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (ll)blockDim.x * gridDim.x)

// Error codes a kernel leaves in the device's error word (read by Synchronize).
#define ERR_LABEL 1
#define ERR_TOKEN 2

extern "C" __global__ void k_add(float *dst, const float *a, const float *b, ll n) {
	LOOP(i, n) dst[i] = __fadd_rn(a[i], b[i]);
}

extern "C" __global__ void k_mul(float *dst, const float *a, const float *b, ll n) {
	LOOP(i, n) dst[i] = __fmul_rn(a[i], b[i]);
}

// y += alpha*x with the product rounded first (never fused).
extern "C" __global__ void k_axpy(float alpha, const float *x, float *y, ll n) {
	LOOP(i, n) y[i] = __fadd_rn(y[i], __fmul_rn(alpha, x[i]));
}

extern "C" __global__ void k_scale(float alpha, float *x, ll n) {
	LOOP(i, n) x[i] = __fmul_rn(alpha, x[i]);
}

// C = beta*C over an m×n block with row stride ldc (beta == 0 writes zeros).
extern "C" __global__ void k_scale2d(float *c, ll m, ll n, ll ldc, float beta) {
	LOOP(i, m * n) {
		ll r = i / n, j = i % n;
		c[r * ldc + j] = beta == 0.0f ? 0.0f : __fmul_rn(beta, c[r * ldc + j]);
	}
}

// ReLU clears every value whose sign bit is set (negatives and -0 become +0).
extern "C" __global__ void k_relu(float *y, const float *x, ll n) {
	LOOP(i, n) {
		float v = x[i];
		y[i] = (int)__float_as_uint(v) < 0 ? 0.0f : v;
	}
}

// dx = dy where the bits of x, as an int, are positive (x > 0 or a positive NaN).
extern "C" __global__ void k_relu_backward(float *dx, const float *x, const float *dy, ll n) {
	LOOP(i, n) dx[i] = (int)__float_as_uint(x[i]) > 0 ? dy[i] : 0.0f;
}

#define SQRT1_2F 0.70710678118654752f
#define INV_SQRT_2PI 0.39894228040143268f

// GELU: x·Φ(x) with Φ(x) = erfc(−x/√2)/2, accurate in the left tail too.
extern "C" __global__ void k_gelu(float *y, const float *x, ll n) {
	LOOP(i, n) {
		float v = x[i];
		y[i] = v * (0.5f * erfcf(-v * SQRT1_2F));
	}
}

extern "C" __global__ void k_gelu_backward(float *dx, const float *x, const float *dy, ll n) {
	LOOP(i, n) {
		float v = x[i];
		float cdf = 0.5f * erfcf(-v * SQRT1_2F);
		float pdf = expf(-0.5f * v * v) * INV_SQRT_2PI;
		dx[i] = dy[i] * (cdf + v * pdf);
	}
}

extern "C" __global__ void k_add_bias(float *x, const float *bias, ll rows, ll cols) {
	LOOP(i, rows * cols) x[i] = __fadd_rn(x[i], bias[i % cols]);
}

// One thread per column, rows in order.
extern "C" __global__ void k_sum_rows(float *dst, const float *x, ll rows, ll cols) {
	LOOP(j, cols) {
		float s = 0.0f;
		for (ll r = 0; r < rows; r++) s = __fadd_rn(s, x[r * cols + j]);
		dst[j] = s;
	}
}

// label returns the class index labels[r] holds, or -1 (and flags err) when
// it is not an integer in [0, cols).
__device__ static int label(const float *labels, ll r, ll cols, int *err) {
	float v = labels[r];
	if (!(v >= 0.0f && v < (float)cols) || (float)(int)v != v) {
		*err = ERR_LABEL;
		return -1;
	}
	return (int)v;
}

// One thread per row, in float64 like the CPU device.
extern "C" __global__ void k_softmax_xent(float *probs, float *loss, const float *logits, const float *labels,
                                          ll rows, ll cols, int *err) {
	LOOP(r, rows) {
		const float *z = logits + r * cols;
		float *p = probs + r * cols;
		float mx = z[0];
		for (ll j = 1; j < cols; j++)
			if (z[j] > mx) mx = z[j];
		double sum = 0;
		for (ll j = 0; j < cols; j++) {
			double e = exp((double)(z[j] - mx));
			sum += e;
			p[j] = (float)e;
		}
		double inv = 1 / sum;
		for (ll j = 0; j < cols; j++) p[j] = (float)((double)p[j] * inv);
		int k = label(labels, r, cols, err);
		loss[r] = k < 0 ? __int_as_float(0x7fc00000) : (float)(log(sum) - (double)(z[k] - mx));
	}
}

extern "C" __global__ void k_softmax_xent_backward(float *dz, const float *probs, const float *labels, ll rows,
                                                   ll cols, float scale, int *err) {
	LOOP(i, rows * cols) {
		ll r = i / cols, j = i % cols;
		int k = label(labels, r, cols, err);
		float v = probs[i];
		if (j == k) v = __fsub_rn(v, 1.0f);
		dz[i] = k < 0 ? __int_as_float(0x7fc00000) : __fmul_rn(scale, v);
	}
}

// nhwc splits the index i of an N×H×W×C tensor into its coordinates.
__device__ static void nhwc(ll i, ll H, ll W, ll C, ll *n, ll *h, ll *w, ll *c) {
	*c = i % C;
	i /= C;
	*w = i % W;
	i /= W;
	*h = i % H;
	*n = i / H;
}

// One thread per element of col: col[(n·OH+oh)·OW+ow][(kh·KW+kw)·C+c].
extern "C" __global__ void k_im2col(float *col, const float *x, ll N, ll H, ll W, ll C, ll KH, ll KW, ll S, ll P,
                                    ll OH, ll OW) {
	LOOP(i, N * OH * OW * KH * KW * C) {
		ll K = KH * KW * C, n, oh, ow, c, kh, kw, unused;
		nhwc(i / K, OH, OW, 1, &n, &oh, &ow, &unused);
		nhwc(i % K, KH, KW, C, &unused, &kh, &kw, &c);
		ll ih = oh * S - P + kh, iw = ow * S - P + kw;
		col[i] = (ih >= 0 && ih < H && iw >= 0 && iw < W) ? x[((n * H + ih) * W + iw) * C + c] : 0.0f;
	}
}

// lo_hi sets [*lo, *hi] to the output positions o in [0, out) whose window
// (o·S − P … o·S − P + K − 1) covers input position i.
__device__ static void lo_hi(ll i, ll K, ll S, ll P, ll out, ll *lo, ll *hi) {
	ll a = i + P - K + 1; // o·S ≥ a
	*lo = a > 0 ? (a + S - 1) / S : 0;
	ll h = (i + P) / S; // o·S ≤ i + P
	*hi = h < out - 1 ? h : out - 1;
}

// One thread per input element, adding its col entries in col's row order.
extern "C" __global__ void k_col2im(float *dx, const float *col, ll N, ll H, ll W, ll C, ll KH, ll KW, ll S, ll P,
                                    ll OH, ll OW) {
	ll K = KH * KW * C;
	LOOP(i, N * H * W * C) {
		ll n, ih, iw, c;
		nhwc(i, H, W, C, &n, &ih, &iw, &c);
		ll oh0, oh1, ow0, ow1;
		lo_hi(ih, KH, S, P, OH, &oh0, &oh1);
		lo_hi(iw, KW, S, P, OW, &ow0, &ow1);
		float s = 0.0f;
		for (ll oh = oh0; oh <= oh1; oh++) {
			ll kh = ih + P - oh * S;
			for (ll ow = ow0; ow <= ow1; ow++) {
				ll kw = iw + P - ow * S;
				s = __fadd_rn(s, col[((n * OH + oh) * OW + ow) * K + (kh * KW + kw) * C + c]);
			}
		}
		dx[i] = s;
	}
}

// One thread per output element; the first maximum in scan order wins.
extern "C" __global__ void k_maxpool(float *y, float *argmax, const float *x, ll N, ll H, ll W, ll C, ll K, ll S,
                                     ll OH, ll OW) {
	LOOP(o, N * OH * OW * C) {
		ll n, oh, ow, c;
		nhwc(o, OH, OW, C, &n, &oh, &ow, &c);
		const float *img = x + n * H * W * C;
		ll ih0 = oh * S, iw0 = ow * S;
		ll pos = ih0 * W + iw0;
		float best = img[pos * C + c];
		for (ll kh = 0; kh < K; kh++)
			for (ll kw = 0; kw < K; kw++) {
				ll p = (ih0 + kh) * W + iw0 + kw;
				float v = img[p * C + c];
				if (v > best) {
					best = v;
					pos = p;
				}
			}
		y[o] = best;
		argmax[o] = (float)pos;
	}
}

// One thread per input element, adding the dy of every window that chose it,
// in y's row order.
extern "C" __global__ void k_maxpool_backward(float *dx, const float *dy, const float *argmax, ll N, ll H, ll W,
                                              ll C, ll K, ll S, ll OH, ll OW) {
	LOOP(i, N * H * W * C) {
		ll n, ih, iw, c;
		nhwc(i, H, W, C, &n, &ih, &iw, &c);
		ll oh0, oh1, ow0, ow1;
		lo_hi(ih, K, S, 0, OH, &oh0, &oh1);
		lo_hi(iw, K, S, 0, OW, &ow0, &ow1);
		float p = (float)(ih * W + iw);
		float s = 0.0f;
		for (ll oh = oh0; oh <= oh1; oh++)
			for (ll ow = ow0; ow <= ow1; ow++) {
				ll o = ((n * OH + oh) * OW + ow) * C + c;
				if (argmax[o] == p) s = __fadd_rn(s, dy[o]);
			}
		dx[i] = s;
	}
}

// One thread per row, in float64 like the CPU device.
extern "C" __global__ void k_layernorm(float *y, float *mean, float *rstd, const float *x, const float *gamma,
                                       const float *beta, ll rows, ll cols, float eps) {
	LOOP(r, rows) {
		const float *xr = x + r * cols;
		double s = 0;
		for (ll j = 0; j < cols; j++) s += (double)xr[j];
		double m = s / (double)cols;
		double ss = 0;
		for (ll j = 0; j < cols; j++) {
			double d = (double)xr[j] - m;
			ss += d * d;
		}
		double rinv = 1 / sqrt(ss / (double)cols + (double)eps);
		mean[r] = (float)m;
		rstd[r] = (float)rinv;
		for (ll j = 0; j < cols; j++) y[r * cols + j] = (float)(((double)xr[j] - m) * rinv * (double)gamma[j] + (double)beta[j]);
	}
}

// dgamma and dbeta: one thread per column, rows in order, accumulated in
// float32 like the CPU device.
extern "C" __global__ void k_layernorm_backward_params(float *dgamma, float *dbeta, const float *dy, const float *x,
                                                       const float *mean, const float *rstd, ll rows, ll cols) {
	LOOP(j, cols) {
		float gg = 0.0f, gb = 0.0f;
		for (ll r = 0; r < rows; r++) {
			double xh = ((double)x[r * cols + j] - (double)mean[r]) * (double)rstd[r];
			float g = dy[r * cols + j];
			gg = __fadd_rn(gg, (float)((double)g * xh));
			gb = __fadd_rn(gb, g);
		}
		dgamma[j] = gg;
		dbeta[j] = gb;
	}
}

// dx: one thread per row, in float64.
extern "C" __global__ void k_layernorm_backward_dx(float *dx, const float *dy, const float *x, const float *mean,
                                                   const float *rstd, const float *gamma, ll rows, ll cols) {
	LOOP(r, rows) {
		double m = (double)mean[r], ri = (double)rstd[r];
		double sg = 0, sgx = 0;
		for (ll j = 0; j < cols; j++) {
			double xh = ((double)x[r * cols + j] - m) * ri;
			double g = (double)dy[r * cols + j] * (double)gamma[j];
			sg += g;
			sgx += g * xh;
		}
		sg /= (double)cols;
		sgx /= (double)cols;
		for (ll j = 0; j < cols; j++) {
			double xh = ((double)x[r * cols + j] - m) * ri;
			double g = (double)dy[r * cols + j] * (double)gamma[j];
			dx[r * cols + j] = (float)(ri * (g - sg - xh * sgx));
		}
	}
}

// token returns the index ids[i] holds, or -1 (and flags err) when it is not
// an integer in [0, vocab).
__device__ static ll token(const float *ids, ll i, ll vocab, int *err) {
	float v = ids[i];
	if (!(v >= 0.0f && v < (float)vocab) || (float)(ll)v != v) {
		*err = ERR_TOKEN;
		return -1;
	}
	return (ll)v;
}

// One thread per element of y; a bad token gives a NaN row.
extern "C" __global__ void k_embedding(float *y, const float *table, const float *ids, ll rows, ll vocab, ll dim,
                                       int *err) {
	LOOP(i, rows * dim) {
		ll k = token(ids, i / dim, vocab, err);
		y[i] = k < 0 ? __int_as_float(0x7fc00000) : table[k * dim + i % dim];
	}
}

// One thread per column, adding the rows of dy in order (deterministic, no
// atomics); a bad token's row is skipped.
extern "C" __global__ void k_embedding_backward(float *dtable, const float *ids, const float *dy, ll rows, ll vocab,
                                                ll dim, int *err) {
	LOOP(j, dim) {
		for (ll i = 0; i < rows; i++) {
			ll k = token(ids, i, vocab, err);
			if (k >= 0) dtable[k * dim + j] = __fadd_rn(dtable[k * dim + j], dy[i * dim + j]);
		}
	}
}

// One thread per row of the blocks·t rows, in float64 like the CPU device;
// row r is row r % t of its block and sees columns 0 … r % t.
extern "C" __global__ void k_causal_softmax(float *y, const float *x, ll blocks, ll t, float scale) {
	LOOP(r, blocks * t) {
		ll i = r % t;
		const float *xr = x + r * t;
		float *yr = y + r * t;
		double sc = (double)scale;
		double m = sc * (double)xr[0];
		for (ll j = 1; j <= i; j++) {
			double v = sc * (double)xr[j];
			if (v > m) m = v;
		}
		double sum = 0;
		for (ll j = 0; j <= i; j++) sum += exp(sc * (double)xr[j] - m);
		for (ll j = 0; j <= i; j++) yr[j] = (float)(exp(sc * (double)xr[j] - m) / sum);
		for (ll j = i + 1; j < t; j++) yr[j] = 0.0f;
	}
}

extern "C" __global__ void k_causal_softmax_backward(float *dx, const float *y, const float *dy, ll blocks, ll t,
                                                     float scale) {
	LOOP(r, blocks * t) {
		ll i = r % t;
		const float *yr = y + r * t, *gr = dy + r * t;
		float *xr = dx + r * t;
		double dot = 0;
		for (ll j = 0; j <= i; j++) dot += (double)yr[j] * (double)gr[j];
		for (ll j = 0; j <= i; j++) xr[j] = (float)((double)scale * (double)yr[j] * ((double)gr[j] - dot));
		for (ll j = i + 1; j < t; j++) xr[j] = 0.0f;
	}
}

// gpu.Uniform: splitmix64 of seed + (i+1)·φ, 24 high bits scaled to [0, 1).
__device__ static float uniform(u64 seed, u64 i) {
	u64 z = seed + (i + 1) * 0x9e3779b97f4a7c15ULL;
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
	z ^= z >> 31;
	return (float)(z >> 40) * (1.0f / 16777216.0f);
}

extern "C" __global__ void k_dropout_mask(float *mask, ll n, float p, u64 seed) {
	float keep = __fdiv_rn(1.0f, __fsub_rn(1.0f, p));
	LOOP(i, n) mask[i] = uniform(seed, (u64)i) >= p ? keep : 0.0f;
}
