package compress

import (
	"math"
	"testing"
)

// TestDyn8KnownAnswers checks the codes and values listed in docs/codecs.md (absmax 1).
func TestDyn8KnownAnswers(t *testing.T) {
	tab := dyn8()
	for _, tc := range []struct {
		x    float32
		code byte
		val  float64
	}{
		{0.5, 0b01011100, 0.50078125},
		{-0.25, 0b11001010, -0.24765625},
		{0.01, 0b00011111, 0.00971875},
		{0.0003, 0b00001001, 0.00026875},
		{0.99, 0b01111111, 0.99296875},
		{1.0, 0b01111111, 0.99296875},
		{0, 0, 0},
	} {
		var out [1]byte
		dyn8Encode(tab, out[:], []float32{tc.x}, 1)
		if out[0] != tc.code {
			t.Errorf("dyn8(%g) = %08b, want %08b", tc.x, out[0], tc.code)
		}
		if got := tab.signed[tc.code]; got != float32(tc.val) {
			t.Errorf("value of %08b = %g, want %g", tc.code, got, tc.val)
		}
	}
	c := mustNew(t, "dyn8", Options{Layout: FlatLayout(4)})
	src := []float32{0.02, -0.5, 1.0, -0.001}
	b, err := c.Encode(nil, src, Pos{})
	if err != nil {
		t.Fatal(err)
	}
	want := []byte{0b00100011, 0b11011100, 0b01111111, 0b10001111}
	if string(b[4:]) != string(want) || getF32(b) != 1 {
		t.Errorf("dyn8 tensor: absmax %g codes %08b, want 1 %08b", getF32(b), b[4:], want)
	}
	out := make([]float32, 4)
	if err := c.Decode(out, b); err != nil {
		t.Fatal(err)
	}
	for i, w := range []float64{0.01984375, -0.50078125, 0.99296875, -0.00094375} {
		if out[i] != float32(w) {
			t.Errorf("dyn8 decode[%d] = %g, want %g", i, out[i], w)
		}
	}
}

// TestDyn8Nearest checks the table encoder against a linear scan of the codebook.
func TestDyn8Nearest(t *testing.T) {
	tab := dyn8()
	g := gradient(1, 1<<16)
	m := absMax(g)
	var got [1]byte
	for _, x := range g {
		a := math.Abs(float64(x)) * float64(1/m)
		best, bestD := 0, math.Inf(1)
		for c := range 128 {
			if d := math.Abs(float64(tab.value[c]) - a); d < bestD {
				best, bestD = c, d
			}
		}
		dyn8Encode(tab, got[:], []float32{x}, m)
		mag := int(got[0] & 0x7f)
		// Allow the float32 rounding of the midpoint to decide exact ties.
		if mag != best && math.Abs(math.Abs(float64(tab.value[mag])-a)-bestD) > 1e-7*a {
			t.Fatalf("dyn8 of %g (a=%g) = code %d (%g), nearest is %d (%g)", x, a, mag, tab.value[mag], best, tab.value[best])
		}
		if (x < 0) != (got[0]&0x80 != 0) && mag != 0 {
			t.Fatalf("dyn8 of %g lost its sign", x)
		}
	}
}

// qsgdWithU encodes v with s levels and explicit uniforms u (through the codec's
// own bucket encoder and decoder) and returns the decoded values.
func qsgdWithU(t *testing.T, v, u []float32, s int32, bucket int, norm string) []float32 {
	t.Helper()
	cd := mustNew(t, "qsgd:bits=8,norm="+norm+",block="+itoa(bucket), Options{Layout: FlatLayout(len(v))})
	c := cd.(*qsgdCodec)
	c.levels = s
	buf := make([]byte, c.MaxEncodedLen(len(v)))
	out := buf
	for b := 0; b < len(v); b += bucket {
		e := min(b+bucket, len(v))
		out = c.encodeBlock(out, v[b:e], u[b:e])
	}
	dec := make([]float32, len(v))
	if err := c.Decode(dec, buf); err != nil {
		t.Fatal(err)
	}
	return dec
}

func itoa(i int) string { return formatInt(i) }

// TestQSGDKnownAnswers checks the explicit-u examples of docs/codecs.md.
func TestQSGDKnownAnswers(t *testing.T) {
	for _, tc := range []struct {
		v, u   []float32
		s      int32
		bucket int
		want   []float32
	}{
		{[]float32{3, -4}, []float32{0.5, 0.9}, 1, 2, []float32{5, 0}},
		{[]float32{3, -4}, []float32{0.5, 0.1}, 4, 2, []float32{2.5, -5}},
		{[]float32{3, -4}, []float32{0.3, 0.9}, 4, 2, []float32{3.75, -3.75}},
		{[]float32{3, -4, 0, 1}, []float32{0.5, 0.9, 0.2, 0.99}, 1, 2, []float32{5, 0, 0, 1}},
	} {
		got := qsgdWithU(t, tc.v, tc.u, tc.s, tc.bucket, "l2")
		if !near(got, tc.want, 0) {
			t.Errorf("qsgd s=%d v=%v u=%v = %v, want %v", tc.s, tc.v, tc.u, got, tc.want)
		}
	}
}

// TestQSGDUnbiased checks that the mean of 1e5 draws equals v within 3σ.
func TestQSGDUnbiased(t *testing.T) {
	v := []float32{0.3, -1.7, 0.01, 2.5, -0.6, 0, 1.1, -0.05}
	const draws = 100000
	for _, spec := range []string{"qsgd:bits=2,block=8", "qsgd:bits=4,block=8", "qsgd:bits=8,block=4,norm=linf"} {
		c := mustNew(t, spec, Options{Layout: FlatLayout(len(v)), Seed: 7}).(*qsgdCodec)
		sum := make([]float64, len(v))
		buf := make([]byte, 0, c.MaxEncodedLen(len(v)))
		out := make([]float32, len(v))
		for d := range draws {
			b, err := c.Encode(buf[:0], v, Pos{Step: uint64(d)})
			if err != nil {
				t.Fatal(err)
			}
			if err := c.Decode(out, b); err != nil {
				t.Fatal(err)
			}
			for i, x := range out {
				sum[i] += float64(x)
			}
		}
		for b := 0; b < len(v); b += c.block {
			vb := v[b:min(b+c.block, len(v))]
			n := float64(c.norm(vb))
			for i, x := range vb {
				a := math.Abs(float64(x)) * float64(c.levels) / n
				p := a - math.Floor(a)
				sigma := n / float64(c.levels) * math.Sqrt(p*(1-p)/draws)
				mean := sum[b+i] / draws
				if math.Abs(mean-float64(x)) > 3*sigma+1e-6 {
					t.Errorf("%s: mean of v[%d]=%g is %g, beyond 3σ = %g", spec, b+i, x, mean, 3*sigma)
				}
			}
		}
	}
}

// TestOneBitKnownAnswer checks the CNTK example: column [1, 2, −3, −1].
func TestOneBitKnownAnswer(t *testing.T) {
	c := mustNew(t, "onebit:block=4", Options{Layout: FlatLayout(4)})
	got := roundTrip(t, c, []float32{1, 2, -3, -1}, Pos{Feedback: true})
	if !near(got, []float32{1.5, 1.5, -2, -2}, 0) {
		t.Errorf("onebit = %v", got)
	}
	if e := c.(*oneBitCodec).res.e; !near(e, []float32{-0.5, 0.5, -1, 1}, 0) {
		t.Errorf("onebit residual = %v", e)
	}
}

// TestSignKnownAnswer checks the two EF-SignSGD steps.
func TestSignKnownAnswer(t *testing.T) {
	c := mustNew(t, "sign", Options{Layout: FlatLayout(4)})
	res := &c.(*signCodec).res
	got := roundTrip(t, c, []float32{1, -2, 3, -4}, Pos{Feedback: true})
	if !near(got, []float32{2.5, -2.5, 2.5, -2.5}, 0) || !near(res.e, []float32{-1.5, 0.5, 0.5, -1.5}, 0) {
		t.Errorf("sign step 1 = %v, residual %v", got, res.e)
	}
	got = roundTrip(t, c, make([]float32, 4), Pos{Feedback: true, Step: 1})
	if !near(got, []float32{-1, 1, 1, -1}, 0) || !near(res.e, []float32{-0.5, -0.5, -0.5, -0.5}, 0) {
		t.Errorf("sign step 2 = %v, residual %v", got, res.e)
	}
}

// topkPayload splits a topk payload into indices and values.
func topkPayload(b []byte) (idx []uint32, val []float32) {
	k := int(le32(b))
	for j := range k {
		idx = append(idx, le32(b[4+4*j:]))
		val = append(val, getF32(b[4+4*k+4*j:]))
	}
	return idx, val
}

// TestTopKKnownAnswer checks the two k = 2 steps of docs/codecs.md.
func TestTopKKnownAnswer(t *testing.T) {
	c := mustNew(t, "topk:ratio=0.5", Options{Layout: FlatLayout(4)})
	res := &c.(*topKCodec).res
	b, err := c.Encode(nil, []float32{0.1, -0.5, 0.3, 0.05}, Pos{Feedback: true})
	if err != nil {
		t.Fatal(err)
	}
	idx, val := topkPayload(b)
	if len(idx) != 2 || idx[0] != 1 || idx[1] != 2 || val[0] != -0.5 || val[1] != 0.3 ||
		!near(res.e, []float32{0.1, 0, 0, 0.05}, 0) {
		t.Errorf("topk step 1: idx %v val %v residual %v", idx, val, res.e)
	}
	b, err = c.Encode(nil, []float32{0.1, 0.1, 0.1, 0.1}, Pos{Feedback: true, Step: 1})
	if err != nil {
		t.Fatal(err)
	}
	idx, _ = topkPayload(b)
	if len(idx) != 2 || idx[0] != 0 || idx[1] != 3 || !near(res.e, []float32{0, 0.1, 0.1, 0}, 0) {
		t.Errorf("topk step 2: idx %v residual %v", idx, res.e)
	}
	// Ties go to the lower index.
	b, _ = c.Encode(nil, []float32{1, -2, 2, -2}, Pos{})
	if idx, _ = topkPayload(b); idx[0] != 1 || idx[1] != 2 {
		t.Errorf("topk ties: idx %v, want [1 2]", idx)
	}
}

// TestTopKDGCKnownAnswer: m = 0.9, k = 1, g = [1, 0.1]: index 0 at steps 1–4, index 1 at step 5 with 1.31441.
func TestTopKDGCKnownAnswer(t *testing.T) {
	c := mustNew(t, "topk:ratio=0.5,dgc=true,momentum=0.9", Options{Layout: FlatLayout(2)})
	for step := 1; step <= 5; step++ {
		b, err := c.Encode(nil, []float32{1, 0.1}, Pos{Feedback: true, Step: uint64(step)})
		if err != nil {
			t.Fatal(err)
		}
		idx, val := topkPayload(b)
		wantIdx := uint32(0)
		if step == 5 {
			wantIdx = 1
		}
		if len(idx) != 1 || idx[0] != wantIdx {
			t.Fatalf("dgc step %d sent %v, want [%d]", step, idx, wantIdx)
		}
		if step == 5 && math.Abs(float64(val[0])-1.31441) > 1e-5 {
			t.Errorf("dgc step 5 value %g, want 1.31441", val[0])
		}
	}
}

// TestSInt8KnownAnswer: W = 2, L = 63, g₁ = [0.5, −1.2], g₂ = [0.2, 1.26] → [0.7, 0.06].
func TestSInt8KnownAnswer(t *testing.T) {
	g := [][]float32{{0.5, -1.2}, {0.2, 1.26}}
	wantQ := [][]int8{{25, -60}, {10, 63}}
	var peers []SharedScaler
	absmax := []float32{0}
	for i := range g {
		c := mustNew(t, "sint8", Options{Layout: FlatLayout(2), Seed: uint64(i + 1)}).(SharedScaler)
		peers = append(peers, c)
		s := make([]float32, c.NumScales(2))
		c.Scales(s, g[i])
		absmax[0] = max(absmax[0], s[0])
	}
	var sum []byte
	for i, c := range peers {
		b, err := c.EncodeScaled(nil, g[i], absmax, 2, Pos{Step: 3})
		if err != nil {
			t.Fatal(err)
		}
		for j, q := range wantQ[i] {
			if int8(b[j]) != q {
				t.Errorf("peer %d codes %v, want %v", i, b, wantQ[i])
			}
		}
		if sum == nil {
			sum = b
		} else if err := c.AddEncoded(sum, b); err != nil {
			t.Fatal(err)
		}
	}
	out := make([]float32, 2)
	if err := peers[0].DecodeScaled(out, sum, absmax, 2); err != nil {
		t.Fatal(err)
	}
	if out[0] != 0.7 || out[1] != 0.06 {
		t.Errorf("sint8 sum = %v, want [0.7 0.06]", out)
	}
}

// TestFP16Rounding checks IEEE binary16 round-to-nearest-even.
func TestFP16Rounding(t *testing.T) {
	for _, tc := range []struct {
		x float32
		h uint16
	}{
		{1, 0x3c00}, {-2, 0xc000}, {65504, 0x7bff}, {65519.99, 0x7bff}, {65520, 0x7c00},
		{1e6, 0x7c00}, {float32(math.Inf(-1)), 0xfc00}, {0x1p-24, 0x0001}, {0x1p-25, 0},
		{0x1.8p-24, 0x0002}, {0x3p-25, 0x0002}, {0x1p-14, 0x0400}, {1 + 0x1p-11, 0x3c00},
		{1 + 0x3p-11, 0x3c02}, {float32(math.Copysign(0, -1)), 0x8000}, {0x1.ffcp-15, 0x0400},
	} {
		if got := f32ToF16(tc.x); got != tc.h {
			t.Errorf("fp16(%g) = %#04x, want %#04x", tc.x, got, tc.h)
		}
	}
	if h := f32ToF16(float32(math.NaN())); h&0x7c00 != 0x7c00 || h&0x3ff == 0 {
		t.Errorf("fp16(NaN) = %#04x", h)
	}
	for h := range 1 << 16 {
		if h&0x7c00 == 0x7c00 && h&0x3ff != 0 {
			continue
		}
		if got := f32ToF16(f16ToF32(uint16(h))); got != uint16(h) {
			t.Fatalf("fp16 round trip of %#04x = %#04x", h, got)
		}
	}
	checkNearestEven(t, "fp16", func(x float32) (uint16, float32) {
		h := f32ToF16(x)
		return h, f16ToF32(h)
	}, f16ToF32, 65504)
}

// TestBF16Rounding checks bfloat16 round-to-nearest-even.
func TestBF16Rounding(t *testing.T) {
	dec := func(h uint16) float32 { return math.Float32frombits(uint32(h) << 16) }
	for _, tc := range []struct {
		x float32
		h uint16
	}{
		{1, 0x3f80}, {math.Float32frombits(0x3f808000), 0x3f80}, {math.Float32frombits(0x3f818000), 0x3f82},
		{math.Float32frombits(0x3f808001), 0x3f81}, {math.MaxFloat32, 0x7f80}, {-3, 0xc040},
	} {
		if got := f32ToBF16(tc.x); got != tc.h {
			t.Errorf("bf16(%g) = %#04x, want %#04x", tc.x, got, tc.h)
		}
	}
	if h := f32ToBF16(float32(math.NaN())); dec(h) == dec(h) {
		t.Errorf("bf16(NaN) = %#04x is not NaN", h)
	}
	checkNearestEven(t, "bf16", func(x float32) (uint16, float32) {
		h := f32ToBF16(x)
		return h, dec(h)
	}, dec, 3e38)
}

// checkNearestEven checks on random values that conv returns the nearest
// representable value, ties to an even code.
func checkNearestEven(t *testing.T, name string, conv func(float32) (uint16, float32), dec func(uint16) float32, maxFinite float64) {
	t.Helper()
	g := gradient(3, 200000)
	for i, x := range g {
		x *= float32(math.Pow(10, float64(i%12)-4)) // spread over exponents
		if math.Abs(float64(x)) > maxFinite {
			continue
		}
		h, y := conv(x)
		d := math.Abs(float64(y) - float64(x))
		for _, nb := range []uint16{h - 1, h + 1} {
			z := float64(dec(nb))
			if math.IsNaN(z) || math.IsInf(z, 0) || (nb^h)&0x8000 != 0 {
				continue
			}
			dn := math.Abs(z - float64(x))
			if dn < d || (dn == d && h&1 != 0) {
				t.Fatalf("%s(%g) = %#04x (%g), but %#04x (%g) is nearer or even", name, x, h, y, nb, z)
			}
		}
	}
}

// TestInt8Bounds checks |x − x̂| <= absmax/254 per bucket, and dyn8's bound.
func TestInt8Bounds(t *testing.T) {
	g := gradient(4, 10000)
	for _, tc := range []struct {
		spec string
		rel  float64 // bound relative to the bucket absmax
	}{
		{"int8:block=100", 1.0 / 254},
		{"sint8:block=100", 1.0 / 127},
		// dyn8: half the largest gap of the codebook (in the top decade, 0.9/64/2).
		{"dyn8:block=100", 0.9 / 128},
	} {
		c := mustNew(t, tc.spec, Options{Layout: FlatLayout(len(g))})
		got := roundTrip(t, c, g, Pos{})
		for b := 0; b < len(g); b += 100 {
			m := float64(absMax(g[b : b+100]))
			for i := b; i < b+100; i++ {
				if d := math.Abs(float64(got[i] - g[i])); d > m*tc.rel*(1+1e-5) {
					t.Fatalf("%s: value %d: %g decoded %g, error %g > %g", tc.spec, i, g[i], got[i], d, m*tc.rel)
				}
			}
		}
	}
}

// TestSInt8Stochastic checks that the random stream of sint8 does not depend on
// where a slice starts, and that its rounding is unbiased within 3σ.
func TestSInt8Stochastic(t *testing.T) {
	v := gradient(8, 23)
	m := absMax(v)
	whole := make([]byte, len(v))
	quantStochastic(whole, v, 42, 0, m, 63)
	for first := 1; first < 9; first++ {
		part := make([]byte, len(v)-first)
		quantStochastic(part, v[first:], 42, first, m, 63)
		if string(part) != string(whole[first:]) {
			t.Fatalf("stream from %d differs", first)
		}
	}
	const draws = 100000
	sum := make([]float64, len(v))
	out := make([]byte, len(v))
	for d := range draws {
		quantStochastic(out, v, uint64(d)*golden, 0, m, 63)
		for i, q := range out {
			sum[i] += float64(int8(q))
		}
	}
	for i, x := range v {
		a := float64(float32(x * (63 / m)))
		p := a - math.Floor(a)
		sigma := math.Sqrt(p * (1 - p) / draws)
		if math.Abs(sum[i]/draws-a) > 3*sigma+1e-4 {
			t.Errorf("sint8 mean of %g levels is %g, beyond 3σ = %g", a, sum[i]/draws, 3*sigma)
		}
	}
}

func TestFP32IsNone(t *testing.T) {
	got, err := Canonical("fp32")
	if err != nil || got != "none" {
		t.Fatalf("Canonical(fp32) = %q, %v; want none", got, err)
	}
}
