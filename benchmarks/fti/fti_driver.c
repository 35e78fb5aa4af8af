/* FTI's side of benchmarks/bench_fti.py: times FTI_Checkpoint at each level asked for.

       mpiexec -n 4 fti_driver CONFIG MIB_PER_RANK REPS GAP_SECONDS LEVEL...

   Each rank protects MIB_PER_RANK MiB of incompressible bytes (xorshift, written before the
   first checkpoint), then per LEVEL (1-4) takes REPS checkpoints, each between barriers and
   followed by GAP_SECONDS idle on every rank (0: back to back); a checkpoint's time is the
   slowest rank's. Rank 0 prints "MPI-STARTED" once every
   rank is past MPI_Init (the benchmarks' start-up check), then one line
   RESULT {"<level>": [seconds, ...], ...}. */
#include <fti.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int world_rank;
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
    MPI_Barrier(MPI_COMM_WORLD);
    if (world_rank == 0) { printf("MPI-STARTED\n"); fflush(stdout); }
    if (argc < 6) {
        fprintf(stderr, "usage: fti_driver CONFIG MIB_PER_RANK REPS GAP_SECONDS LEVEL...\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    size_t bytes = (size_t)atol(argv[2]) << 20;
    int reps = atoi(argv[3]);
    double gap = atof(argv[4]);
    if (bytes == 0 || bytes > 0x7fffffffUL || reps < 1 || !(gap >= 0)) {
        fprintf(stderr, "fti_driver: MIB_PER_RANK must be 1-2047, REPS at least 1, GAP_SECONDS at least 0\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    if (FTI_Init(argv[1], MPI_COMM_WORLD) != FTI_SCES) {
        fprintf(stderr, "fti_driver: FTI_Init(%s) failed\n", argv[1]);
        MPI_Abort(MPI_COMM_WORLD, 3);
    }
    int rank;
    MPI_Comm_rank(FTI_COMM_WORLD, &rank);
    unsigned char *data = malloc(bytes);
    if (data == NULL) MPI_Abort(MPI_COMM_WORLD, 4);
    unsigned long long x = 88172645463325252ULL + (unsigned long long)rank;
    for (size_t i = 0; i < bytes; i += 8) {
        x ^= x << 13; x ^= x >> 7; x ^= x << 17;
        memcpy(data + i, &x, bytes - i < 8 ? bytes - i : 8);
    }
    FTI_Protect(0, data, (int32_t)bytes, FTI_CHAR);
    int id = 1;
    if (rank == 0) printf("RESULT {");
    struct timespec idle = {(time_t)gap, (long)((gap - (double)(time_t)gap) * 1e9)};
    for (int a = 5; a < argc; a++) {
        int level = atoi(argv[a]);
        if (rank == 0) printf("%s\"%d\": [", a > 5 ? ", " : "", level);
        for (int r = 0; r < reps; r++) {
            MPI_Barrier(FTI_COMM_WORLD);
            double t = MPI_Wtime();
            int rc = FTI_Checkpoint(id++, level);
            t = MPI_Wtime() - t;
            if (rc != FTI_DONE && rc != FTI_SCES) {
                fprintf(stderr, "fti_driver: FTI_Checkpoint at level %d returned %d\n", level, rc);
                MPI_Abort(MPI_COMM_WORLD, 5);
            }
            double slowest;
            MPI_Reduce(&t, &slowest, 1, MPI_DOUBLE, MPI_MAX, 0, FTI_COMM_WORLD);
            if (rank == 0) printf("%s%.6f", r ? ", " : "", slowest);
            if (gap > 0) nanosleep(&idle, NULL);
        }
        if (rank == 0) printf("]");
    }
    if (rank == 0) { printf("}\n"); fflush(stdout); }
    FTI_Finalize();
    free(data);
    MPI_Finalize();
    return 0;
}
