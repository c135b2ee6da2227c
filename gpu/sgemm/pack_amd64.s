//go:build amd64 && !purego

#include "textflag.h"

// TRANSPOSE8 transposes the 8×8 block of rows Y0..Y7 into Y8..Y15 (Y8 holds
// element 0 of every row, and so on), clobbering Y0..Y7.
#define TRANSPOSE8 \
	VUNPCKLPS  Y1, Y0, Y8;        \
	VUNPCKHPS  Y1, Y0, Y9;        \
	VUNPCKLPS  Y3, Y2, Y10;       \
	VUNPCKHPS  Y3, Y2, Y11;       \
	VUNPCKLPS  Y5, Y4, Y12;       \
	VUNPCKHPS  Y5, Y4, Y13;       \
	VUNPCKLPS  Y7, Y6, Y14;       \
	VUNPCKHPS  Y7, Y6, Y15;       \
	VSHUFPS    $0x44, Y10, Y8, Y0; \
	VSHUFPS    $0xEE, Y10, Y8, Y1; \
	VSHUFPS    $0x44, Y11, Y9, Y2; \
	VSHUFPS    $0xEE, Y11, Y9, Y3; \
	VSHUFPS    $0x44, Y14, Y12, Y4; \
	VSHUFPS    $0xEE, Y14, Y12, Y5; \
	VSHUFPS    $0x44, Y15, Y13, Y6; \
	VSHUFPS    $0xEE, Y15, Y13, Y7; \
	VPERM2F128 $0x20, Y4, Y0, Y8;  \
	VPERM2F128 $0x20, Y5, Y1, Y9;  \
	VPERM2F128 $0x20, Y6, Y2, Y10; \
	VPERM2F128 $0x20, Y7, Y3, Y11; \
	VPERM2F128 $0x31, Y4, Y0, Y12; \
	VPERM2F128 $0x31, Y5, Y1, Y13; \
	VPERM2F128 $0x31, Y6, Y2, Y14; \
	VPERM2F128 $0x31, Y7, Y3, Y15

// STORE6 stores the first 6 elements of Y at off(DI).
#define STORE6(Y, X, off) \
	VMOVUPS      X, off(DI);      \
	VEXTRACTF128 $1, Y, X0;       \
	VMOVQ        X0, off+16(DI)

// func transpose6(dst, src *float32, ld, blocks int)
TEXT ·transpose6(SB), NOSPLIT, $0-32
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ ld+16(FP), R8
	MOVQ blocks+24(FP), CX
	SHLQ $2, R8
	LEAQ (R8)(R8*2), R9 // 3 rows
	LEAQ (R8)(R8*4), R10 // 5 rows
	VXORPS Y6, Y6, Y6
	VXORPS Y7, Y7, Y7

loop:
	VMOVUPS (SI), Y0
	VMOVUPS (SI)(R8*1), Y1
	VMOVUPS (SI)(R8*2), Y2
	VMOVUPS (SI)(R9*1), Y3
	VMOVUPS (SI)(R8*4), Y4
	VMOVUPS (SI)(R10*1), Y5
	TRANSPOSE8
	STORE6(Y8, X8, 0)
	STORE6(Y9, X9, 24)
	STORE6(Y10, X10, 48)
	STORE6(Y11, X11, 72)
	STORE6(Y12, X12, 96)
	STORE6(Y13, X13, 120)
	STORE6(Y14, X14, 144)
	STORE6(Y15, X15, 168)
	VXORPS Y6, Y6, Y6
	VXORPS Y7, Y7, Y7
	ADDQ   $32, SI
	ADDQ   $192, DI
	DECQ   CX
	JNZ    loop
	VZEROUPPER
	RET

// LOAD8 loads 8 elements from each of the 8 rows at base, row stride R8
// (R9 = 3, R10 = 5, R11 = 7 rows), into Y0..Y7.
#define LOAD8(base) \
	VMOVUPS (base), Y0;        \
	VMOVUPS (base)(R8*1), Y1;  \
	VMOVUPS (base)(R8*2), Y2;  \
	VMOVUPS (base)(R9*1), Y3;  \
	VMOVUPS (base)(R8*4), Y4;  \
	VMOVUPS (base)(R10*1), Y5; \
	VMOVUPS (base)(R9*2), Y6;  \
	VMOVUPS (base)(R11*1), Y7

// STORE8 stores Y8..Y15 as 8-element halves of 16-element rows at off(DI).
#define STORE8(off) \
	VMOVUPS Y8, off(DI);      \
	VMOVUPS Y9, off+64(DI);   \
	VMOVUPS Y10, off+128(DI); \
	VMOVUPS Y11, off+192(DI); \
	VMOVUPS Y12, off+256(DI); \
	VMOVUPS Y13, off+320(DI); \
	VMOVUPS Y14, off+384(DI); \
	VMOVUPS Y15, off+448(DI)

// func transpose16(dst, src *float32, ld, blocks int)
TEXT ·transpose16(SB), NOSPLIT, $0-32
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ ld+16(FP), R8
	MOVQ blocks+24(FP), CX
	SHLQ $2, R8
	LEAQ (R8)(R8*2), R9 // 3 rows
	LEAQ (R8)(R8*4), R10 // 5 rows
	LEAQ (R9)(R8*4), R11 // 7 rows
	LEAQ (SI)(R8*8), DX  // row 8

loop:
	LOAD8(SI)
	TRANSPOSE8
	STORE8(0)
	LOAD8(DX)
	TRANSPOSE8
	STORE8(32)
	ADDQ $32, SI
	ADDQ $32, DX
	ADDQ $512, DI
	DECQ CX
	JNZ  loop
	VZEROUPPER
	RET

// func copy6(dst, src *float32, ld, n int)
TEXT ·copy6(SB), NOSPLIT, $0-32
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ ld+16(FP), R8
	MOVQ n+24(FP), CX
	SHLQ $2, R8

loop6:
	VMOVUPS (SI), X0
	VMOVQ   16(SI), X1
	VMOVUPS X0, (DI)
	VMOVQ   X1, 16(DI)
	ADDQ    R8, SI
	ADDQ    $24, DI
	DECQ    CX
	JNZ     loop6
	RET

// func copy16(dst, src *float32, ld, n int)
TEXT ·copy16(SB), NOSPLIT, $0-32
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ ld+16(FP), R8
	MOVQ n+24(FP), CX
	SHLQ $2, R8

loop16:
	VMOVUPS (SI), Y0
	VMOVUPS 32(SI), Y1
	VMOVUPS Y0, (DI)
	VMOVUPS Y1, 32(DI)
	ADDQ    R8, SI
	ADDQ    $64, DI
	DECQ    CX
	JNZ     loop16
	VZEROUPPER
	RET
