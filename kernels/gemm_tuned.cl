// C[M,N] = A[M,K] @ B[K,N], all row-major, for any M, N, K >= 1: the parameterised kernel that
// hetbench/backends/opencl_tune.py searches per device, dtype and shape class.
//
// Build options (set by hetbench/backends/opencl_tune.py):
//   -DREAL=float|double|half, -DREAL_IS_DOUBLE / -DREAL_IS_HALF   element type in global memory
//   -DVW=1|2|4|8|16   vector width: a work-item reads B and writes C VW elements at a time
//   -DNV              vectors per work-item along N: it computes WN = NV * VW columns
//   -DWM              rows per work-item along M (register blocking: WM x NV vector accumulators)
//   -DLX, -DLY        the work-group (LX along N, LY along M)
//   -DUSE_LOCAL=0|1   0: every work-item reads A and B from global memory (the CPU's caches serve them);
//                     1: the work-group stages a KB-deep slice of A and B in local memory first
//   -DKB              the K depth staged per step (USE_LOCAL=1 only)
//   -DPACK=0|1        1: B is read from pack_b's panels (USE_LOCAL=0 only; the host launches pack_b and gemm_tuned
//                     once per chunk of columns, so the copy is K x chunk, not all of B)
// A work-item computes C[row0 .. row0+WM, col0 .. col0+WN]. Full tiles take the fast path without bounds checks;
// edge tiles read zero outside A and B and skip stores outside C, so no shape needs padding on the host.

#if defined(REAL_IS_DOUBLE)
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
#endif
#if defined(REAL_IS_HALF)
#pragma OPENCL EXTENSION cl_khr_fp16 : enable
#endif

#ifndef REAL
#define REAL float
#endif
#ifndef VW
#define VW 4
#endif
#ifndef NV
#define NV 1
#endif
#ifndef WM
#define WM 4
#endif
#ifndef LX
#define LX 1
#endif
#ifndef LY
#define LY 1
#endif
#ifndef USE_LOCAL
#define USE_LOCAL 0
#endif
#ifndef KB
#define KB 16
#endif

#define WN (NV * VW)
#define CAT_(a, b) a##b
#define CAT(a, b) CAT_(a, b)

// half accumulates in float (K products summed in half lose digits long before K gets large)
#if defined(REAL_IS_HALF)
#define ACC float
#else
#define ACC REAL
#endif

#if VW == 1
#define VACC ACC
#if defined(REAL_IS_HALF)
#define VLOAD(p) vload_half(0, (p))
#define VSTORE(v, p) vstore_half((v), 0, (p))
#else
#define VLOAD(p) (*(p))
#define VSTORE(v, p) (*(p) = (v))
#endif
#else
#define VACC CAT(ACC, VW)
#if defined(REAL_IS_HALF)
#define VLOAD(p) CAT(vload_half, VW)(0, (p))
#define VSTORE(v, p) CAT(vstore_half, VW)((v), 0, (p))
#else
#define VLOAD(p) CAT(vload, VW)(0, (p))
#define VSTORE(v, p) CAT(vstore, VW)((v), 0, (p))
#endif
#endif

#if defined(REAL_IS_HALF)
#define SLOAD(p, i) vload_half((i), (p))
#define SSTORE(p, i, v) vstore_half((float)(v), (i), (p))
#else
#define SLOAD(p, i) ((ACC)(p)[(i)])
#define SSTORE(p, i, v) ((p)[(i)] = (REAL)(v))
#endif

// one lane of a vector accumulator, for the edge path's element-wise stores
#if VW == 1
#define LANE(v, l) (v)
#else
#define LANE(v, l) (((ACC*)&(v))[(l)])
#endif

#ifndef PACK
#define PACK 0
#endif


// PACK=1: B's columns col_base .. col_base+ncols were copied by pack_b into panels of WN columns, each panel K
// rows of WN contiguous elements (zeros past N), so that a work-item streams its B panel from consecutive
// addresses: on a CPU, rows of B a power of two apart map to the same cache sets and evict each other.
__kernel void pack_b(const int N, const int K, const int col_base, const int ncols,
                     __global const REAL* restrict B, const ulong b_offset, __global REAL* restrict Bp)
{
    const int x = get_global_id(0);  // column within this launch's chunk
    const int k = get_global_id(1);
    if (x >= ncols || k >= K)
        return;
    const int c = col_base + x;
    const size_t to = (size_t)(x / WN) * K * WN + (size_t)k * WN + x % WN;
    SSTORE(Bp, to, c < N ? SLOAD(B, b_offset + (size_t)k * N + c) : (ACC)0);
}

#if USE_LOCAL == 0

// C[:, col_base .. col_base + ncols] (every column when PACK=0: col_base 0, ncols N)
__kernel __attribute__((reqd_work_group_size(LX, LY, 1)))
void gemm_tuned(const int M, const int N, const int K, const int col_base, const int ncols,
                __global const REAL* restrict A, const ulong a_offset,
                __global const REAL* restrict B, const ulong b_offset,
                __global REAL* restrict C, const ulong c_offset)
{
    A += a_offset;
    B += b_offset;
    C += c_offset;
    const int panel = get_global_id(0);
    const int col0 = col_base + panel * WN;
    const int row0 = get_global_id(1) * WM;
    if (row0 >= M || panel * WN >= ncols)
        return;

    VACC acc[WM][NV];
    for (int i = 0; i < WM; i++)
        for (int v = 0; v < NV; v++)
            acc[i][v] = (VACC)0;

#if PACK
    const __global REAL* b = B + (size_t)panel * K * WN;
#define B_AT(k, v) VLOAD(b + (size_t)(k) * WN + (v) * VW)
#else
    const __global REAL* b = B + col0;
#define B_AT(k, v) VLOAD(b + (size_t)(k) * N + (v) * VW)
#endif
    const bool full_cols = col0 + WN <= N;
    if (row0 + WM <= M && full_cols) {
        const __global REAL* a = A + (size_t)row0 * K;
        for (int k = 0; k < K; k++) {
            VACC bv[NV];
            for (int v = 0; v < NV; v++)
                bv[v] = B_AT(k, v);
            for (int i = 0; i < WM; i++) {
                const VACC av = (VACC)SLOAD(a, (size_t)i * K + k);
                for (int v = 0; v < NV; v++)
                    acc[i][v] = mad(av, bv[v], acc[i][v]);
            }
        }
        for (int i = 0; i < WM; i++)
            for (int v = 0; v < NV; v++)
                VSTORE(acc[i][v], C + (size_t)(row0 + i) * N + col0 + v * VW);
        return;
    }

    // an edge tile: rows past M read row M-1 (their results are dropped), columns past N read zero
    for (int k = 0; k < K; k++) {
        VACC bv[NV];
        for (int v = 0; v < NV; v++) {
#if PACK
            bv[v] = B_AT(k, v);  // the panel holds zeros past N
#else
            const int c = col0 + v * VW;
            if (c + VW <= N) {
                bv[v] = B_AT(k, v);
            } else {
                bv[v] = (VACC)0;
                for (int l = 0; l < VW && c + l < N; l++)
                    LANE(bv[v], l) = SLOAD(B, (size_t)k * N + c + l);
            }
#endif
        }
        for (int i = 0; i < WM; i++) {
            const int r = min(row0 + i, M - 1);
            const VACC av = (VACC)SLOAD(A, (size_t)r * K + k);
            for (int v = 0; v < NV; v++)
                acc[i][v] = mad(av, bv[v], acc[i][v]);
        }
    }
    for (int i = 0; i < WM && row0 + i < M; i++)
        for (int v = 0; v < NV; v++)
            for (int l = 0; l < VW; l++) {
                const int c = col0 + v * VW + l;
                if (c < N)
                    SSTORE(C, (size_t)(row0 + i) * N + c, LANE(acc[i][v], l));
            }
}

#else  // USE_LOCAL == 1

#define TM (LY * WM)  // the work-group's C tile: TM rows ...
#define TN (LX * WN)  // ... by TN columns
#define THREADS (LX * LY)

__kernel __attribute__((reqd_work_group_size(LX, LY, 1)))
void gemm_tuned(const int M, const int N, const int K, const int col_base, const int ncols,
                __global const REAL* restrict A, const ulong a_offset,
                __global const REAL* restrict B, const ulong b_offset,
                __global REAL* restrict C, const ulong c_offset)
{
    A += a_offset;
    B += b_offset;
    C += c_offset;
    const int lx = get_local_id(0);
    const int ly = get_local_id(1);
    const int tid = ly * LX + lx;
    const int tile_row0 = get_group_id(1) * TM;
    const int tile_col0 = get_group_id(0) * TN;
    const int row0 = tile_row0 + ly * WM;  // this work-item's rows and columns
    const int col0 = tile_col0 + lx * WN;

    __local ACC Asub[TM][KB];
    __local ACC Bsub[KB][TN];

    VACC acc[WM][NV];
    for (int i = 0; i < WM; i++)
        for (int v = 0; v < NV; v++)
            acc[i][v] = (VACC)0;

    const bool full_tile = tile_row0 + TM <= M && tile_col0 + TN <= N;
    for (int k0 = 0; k0 < K; k0 += KB) {
        if (full_tile && k0 + KB <= K) {
            for (int e = tid; e < TM * KB; e += THREADS) {
                const int r = e / KB, c = e % KB;
                Asub[r][c] = SLOAD(A, (size_t)(tile_row0 + r) * K + k0 + c);
            }
            for (int e = tid; e < KB * TN; e += THREADS) {
                const int r = e / TN, c = e % TN;
                Bsub[r][c] = SLOAD(B, (size_t)(k0 + r) * N + tile_col0 + c);
            }
        } else {
            for (int e = tid; e < TM * KB; e += THREADS) {
                const int r = e / KB, c = e % KB;
                const int gr = tile_row0 + r, gc = k0 + c;
                Asub[r][c] = (gr < M && gc < K) ? SLOAD(A, (size_t)gr * K + gc) : (ACC)0;
            }
            for (int e = tid; e < KB * TN; e += THREADS) {
                const int r = e / TN, c = e % TN;
                const int gr = k0 + r, gc = tile_col0 + c;
                Bsub[r][c] = (gr < K && gc < N) ? SLOAD(B, (size_t)gr * N + gc) : (ACC)0;
            }
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int kk = 0; kk < KB; kk++) {
            VACC bv[NV];
            for (int v = 0; v < NV; v++)
#if VW == 1
                bv[v] = Bsub[kk][lx * WN + v];
#else
                bv[v] = CAT(vload, VW)(0, &Bsub[kk][lx * WN + v * VW]);
#endif
            for (int i = 0; i < WM; i++) {
                const VACC av = (VACC)Asub[ly * WM + i][kk];
                for (int v = 0; v < NV; v++)
                    acc[i][v] = mad(av, bv[v], acc[i][v]);
            }
        }
        // the next slice overwrites Asub/Bsub: every work-item must be done reading them
        barrier(CLK_LOCAL_MEM_FENCE);
    }

    if (full_tile) {
        for (int i = 0; i < WM; i++)
            for (int v = 0; v < NV; v++)
                VSTORE(acc[i][v], C + (size_t)(row0 + i) * N + col0 + v * VW);
        return;
    }
    for (int i = 0; i < WM && row0 + i < M; i++)
        for (int v = 0; v < NV; v++)
            for (int l = 0; l < VW; l++) {
                const int c = col0 + v * VW + l;
                if (c < N)
                    SSTORE(C, (size_t)(row0 + i) * N + c, LANE(acc[i][v], l));
            }
}

#endif
