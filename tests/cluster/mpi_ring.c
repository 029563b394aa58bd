/* An MPI job that runs across a checkpoint of its VMs: ROUNDS times, rank 0 sends a
 * counter to rank 1, which adds one and sends it back over the same TCP connection, and
 * rank 0 waits DELAY_MS between rounds (CLOCK_MONOTONIC, which does not count the time
 * a VM was saved). Rank 0 prints one line per round, with both ranks' hostnames (the
 * VMs), and at the end the counter, which is 2 * ROUNDS only when no message was lost
 * or repeated. Usage: mpi_ring ROUNDS DELAY_MS */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static void pause_ms(long ms) {
  struct timespec t = {ms / 1000, (ms % 1000) * 1000000L};
  while (nanosleep(&t, &t) != 0) {
  }
}

int main(int argc, char **argv) {
  int rank, size, counter = 0;
  char host[64] = "", peer[64] = "";
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  int rounds = argc > 1 ? atoi(argv[1]) : 10;
  long delay = argc > 2 ? atol(argv[2]) : 1000;
  if (size != 2) {
    if (rank == 0) fprintf(stderr, "mpi_ring needs exactly 2 ranks\n");
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  gethostname(host, sizeof host - 1);
  if (rank == 0) {
    MPI_Recv(peer, sizeof peer, MPI_CHAR, 1, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
  } else {
    MPI_Send(host, sizeof host, MPI_CHAR, 0, 1, MPI_COMM_WORLD);
  }
  for (int i = 0; i < rounds; i++) {
    if (rank == 0) {
      counter += 1;
      MPI_Send(&counter, 1, MPI_INT, 1, 0, MPI_COMM_WORLD);
      MPI_Recv(&counter, 1, MPI_INT, 1, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      printf("round=%d counter=%d host=%s peer=%s\n", i + 1, counter, host, peer);
      fflush(stdout);
      pause_ms(delay);
    } else {
      MPI_Recv(&counter, 1, MPI_INT, 0, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      counter += 1;
      MPI_Send(&counter, 1, MPI_INT, 0, 0, MPI_COMM_WORLD);
    }
  }
  if (rank == 0) printf("done counter=%d expected=%d\n", counter, 2 * rounds);
  MPI_Finalize();
  return 0;
}
