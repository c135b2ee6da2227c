//go:build amd64 && !purego

#include "textflag.h"

// STEP multiplies column p of the 6-row A panel (at AX+ao) by row p of the
// 16-column B panel (at BX+bo) into the accumulators Y0..Y11 (row r in
// Y(2r), Y(2r+1)).
#define STEP(ao, bo) \
	VMOVUPS      bo(BX), Y12;    \
	VMOVUPS      bo+32(BX), Y13; \
	VBROADCASTSS ao(AX), Y14;    \
	VFMADD231PS  Y12, Y14, Y0;   \
	VFMADD231PS  Y13, Y14, Y1;   \
	VBROADCASTSS ao+4(AX), Y15;  \
	VFMADD231PS  Y12, Y15, Y2;   \
	VFMADD231PS  Y13, Y15, Y3;   \
	VBROADCASTSS ao+8(AX), Y14;  \
	VFMADD231PS  Y12, Y14, Y4;   \
	VFMADD231PS  Y13, Y14, Y5;   \
	VBROADCASTSS ao+12(AX), Y15; \
	VFMADD231PS  Y12, Y15, Y6;   \
	VFMADD231PS  Y13, Y15, Y7;   \
	VBROADCASTSS ao+16(AX), Y14; \
	VFMADD231PS  Y12, Y14, Y8;   \
	VFMADD231PS  Y13, Y14, Y9;   \
	VBROADCASTSS ao+20(AX), Y15; \
	VFMADD231PS  Y12, Y15, Y10;  \
	VFMADD231PS  Y13, Y15, Y11

// UPDATE stores row r0:r1 of the tile into C at DX as
// float32(alpha*acc) + float32(beta*C), then moves DX to the next row.
#define UPDATE(r0, r1) \
	VMULPS  Y14, r0, r0;       \
	VMULPS  Y14, r1, r1;       \
	VMULPS  (DX), Y15, Y12;    \
	VMULPS  32(DX), Y15, Y13;  \
	VADDPS  Y12, r0, r0;       \
	VADDPS  Y13, r1, r1;       \
	VMOVUPS r0, (DX);          \
	VMOVUPS r1, 32(DX);        \
	ADDQ    SI, DX

// STORE stores row r0:r1 of the tile into C at DX as alpha*acc, without
// reading C, then moves DX to the next row.
#define STORE(r0, r1) \
	VMULPS  Y14, r0, r0; \
	VMULPS  Y14, r1, r1; \
	VMOVUPS r0, (DX);    \
	VMOVUPS r1, 32(DX);  \
	ADDQ    SI, DX

// func kernel6x16(kc int, a, b, c *float32, ldc int, alpha, beta float32, load bool)
TEXT ·kernel6x16(SB), NOSPLIT, $0-49
	MOVQ kc+0(FP), CX
	MOVQ a+8(FP), AX
	MOVQ b+16(FP), BX
	MOVQ c+24(FP), DX
	MOVQ ldc+32(FP), SI
	SHLQ $2, SI

	VXORPS Y0, Y0, Y0
	VXORPS Y1, Y1, Y1
	VXORPS Y2, Y2, Y2
	VXORPS Y3, Y3, Y3
	VXORPS Y4, Y4, Y4
	VXORPS Y5, Y5, Y5
	VXORPS Y6, Y6, Y6
	VXORPS Y7, Y7, Y7
	VXORPS Y8, Y8, Y8
	VXORPS Y9, Y9, Y9
	VXORPS Y10, Y10, Y10
	VXORPS Y11, Y11, Y11

	// Touch the six C rows early so they are in cache for the update.
	MOVQ       DX, DI
	PREFETCHT0 (DI)
	PREFETCHT0 60(DI)
	ADDQ       SI, DI
	PREFETCHT0 (DI)
	PREFETCHT0 60(DI)
	ADDQ       SI, DI
	PREFETCHT0 (DI)
	PREFETCHT0 60(DI)
	ADDQ       SI, DI
	PREFETCHT0 (DI)
	PREFETCHT0 60(DI)
	ADDQ       SI, DI
	PREFETCHT0 (DI)
	PREFETCHT0 60(DI)
	ADDQ       SI, DI
	PREFETCHT0 (DI)
	PREFETCHT0 60(DI)

	MOVQ CX, R9
	SHRQ $2, R9
	JZ   tail

loop4:
	STEP(0, 0)
	STEP(24, 64)
	STEP(48, 128)
	STEP(72, 192)
	ADDQ $96, AX
	ADDQ $256, BX
	DECQ R9
	JNZ  loop4

tail:
	ANDQ $3, CX
	JZ   done

loop1:
	STEP(0, 0)
	ADDQ $24, AX
	ADDQ $64, BX
	DECQ CX
	JNZ  loop1

done:
	VBROADCASTSS alpha+40(FP), Y14
	VBROADCASTSS beta+44(FP), Y15
	MOVBLZX      load+48(FP), R8
	TESTQ        R8, R8
	JZ           store

	UPDATE(Y0, Y1)
	UPDATE(Y2, Y3)
	UPDATE(Y4, Y5)
	UPDATE(Y6, Y7)
	UPDATE(Y8, Y9)
	UPDATE(Y10, Y11)
	VZEROUPPER
	RET

store:
	STORE(Y0, Y1)
	STORE(Y2, Y3)
	STORE(Y4, Y5)
	STORE(Y6, Y7)
	STORE(Y8, Y9)
	STORE(Y10, Y11)
	VZEROUPPER
	RET
