// C[M,N] = A[M,K] @ B[K,N], all row-major, for any M, N, K >= 0.
//
// Build options (set by hetbench/backends/opencl.py):
//   -DREAL=float|double|half   element type in global memory
//   -DREAL_IS_DOUBLE / -DREAL_IS_HALF   enable the matching extension
//   -DTS_M, -DTS_N, -DTS_K     the C tile one work-group computes and the K depth staged in local memory
//   -DWPT_M, -DWPT_N           outputs per work-item along M and N (register blocking)
// The work-group is (TS_N / WPT_N, TS_M / WPT_M); the global size is the grid of C tiles, rounded up.
// Loads outside A or B read zero and stores outside C are skipped, so no shape needs padding on the host.

#if defined(REAL_IS_DOUBLE)
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
#endif
#if defined(REAL_IS_HALF)
#pragma OPENCL EXTENSION cl_khr_fp16 : enable
#endif

#ifndef REAL
#define REAL float
#endif

// half accumulates in float: summing K products in half loses digits long before K gets large.
// vload_half/vstore_half convert on the way in and out.
#if defined(REAL_IS_HALF)
#define ACC float
#define LOAD(p, i) vload_half((i), (p))
#define STORE(p, i, v) vstore_half((float)(v), (i), (p))
#else
#define ACC REAL
#define LOAD(p, i) ((p)[(i)])
#define STORE(p, i, v) ((p)[(i)] = (REAL)(v))
#endif

#ifndef TS_M
#define TS_M 32
#endif
#ifndef TS_N
#define TS_N 32
#endif
#ifndef TS_K
#define TS_K 16
#endif
#ifndef WPT_M
#define WPT_M 4
#endif
#ifndef WPT_N
#define WPT_N 4
#endif

#define RTS_M (TS_M / WPT_M)  // work-items along M
#define RTS_N (TS_N / WPT_N)  // work-items along N
#define THREADS (RTS_M * RTS_N)

__kernel __attribute__((reqd_work_group_size(RTS_N, RTS_M, 1)))
void gemm(const int M, const int N, const int K,
          __global const REAL* restrict A, const ulong a_offset,
          __global const REAL* restrict B, const ulong b_offset,
          __global REAL* restrict C, const ulong c_offset)
{
    A += a_offset;
    B += b_offset;
    C += c_offset;

    const int lx = get_local_id(0);
    const int ly = get_local_id(1);
    const int tid = ly * RTS_N + lx;
    const int row0 = get_group_id(1) * TS_M;
    const int col0 = get_group_id(0) * TS_N;

    __local ACC Asub[TS_M][TS_K];
    __local ACC Bsub[TS_K][TS_N];

    ACC acc[WPT_M][WPT_N];
    for (int i = 0; i < WPT_M; i++)
        for (int j = 0; j < WPT_N; j++)
            acc[i][j] = (ACC)0;

    for (int k0 = 0; k0 < K; k0 += TS_K) {
        // consecutive work-items take consecutive elements of a row: coalesced global reads
        for (int e = tid; e < TS_M * TS_K; e += THREADS) {
            const int r = e / TS_K, c = e % TS_K;
            const int gr = row0 + r, gc = k0 + c;
            Asub[r][c] = (gr < M && gc < K) ? (ACC)LOAD(A, (size_t)gr * K + gc) : (ACC)0;
        }
        for (int e = tid; e < TS_K * TS_N; e += THREADS) {
            const int r = e / TS_N, c = e % TS_N;
            const int gr = k0 + r, gc = col0 + c;
            Bsub[r][c] = (gr < K && gc < N) ? (ACC)LOAD(B, (size_t)gr * N + gc) : (ACC)0;
        }
        barrier(CLK_LOCAL_MEM_FENCE);

        for (int kk = 0; kk < TS_K; kk++) {
            ACC a_reg[WPT_M];
            ACC b_reg[WPT_N];
            for (int i = 0; i < WPT_M; i++)
                a_reg[i] = Asub[ly + i * RTS_M][kk];
            for (int j = 0; j < WPT_N; j++)
                b_reg[j] = Bsub[kk][lx + j * RTS_N];
            for (int i = 0; i < WPT_M; i++)
                for (int j = 0; j < WPT_N; j++)
                    acc[i][j] += a_reg[i] * b_reg[j];  // not fma(): slow where the hardware has none
        }
        // the next tile overwrites Asub/Bsub: every work-item must be done reading them
        barrier(CLK_LOCAL_MEM_FENCE);
    }

    for (int i = 0; i < WPT_M; i++) {
        const int r = row0 + ly + i * RTS_M;
        if (r >= M)
            continue;
        for (int j = 0; j < WPT_N; j++) {
            const int c = col0 + lx + j * RTS_N;
            if (c < N)
                STORE(C, (size_t)r * N + c, acc[i][j]);
        }
    }
}
