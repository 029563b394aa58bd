/* A tiny MPI program for the test cluster: rank 0 sends a token to rank 1, which adds
 * one and sends it back, so each rank has really exchanged messages with the other.
 * Every rank prints one line: its rank, the world size, its hostname (the simulated
 * node), the network namespace it runs in and the token it ended with. */
#include <mpi.h>
#include <stdio.h>
#include <unistd.h>

int main(int argc, char **argv) {
  int rank, size, token;
  char host[256] = "", netns[64] = "";
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  gethostname(host, sizeof host - 1);
  ssize_t n = readlink("/proc/self/ns/net", netns, sizeof netns - 1);
  if (n > 0) netns[n] = '\0';
  token = rank == 0 ? 42 : -1;
  if (rank == 0 && size > 1) {
    MPI_Send(&token, 1, MPI_INT, 1, 0, MPI_COMM_WORLD);
    MPI_Recv(&token, 1, MPI_INT, 1, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
  } else if (rank == 1) {
    MPI_Recv(&token, 1, MPI_INT, 0, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    token += 1;
    MPI_Send(&token, 1, MPI_INT, 0, 0, MPI_COMM_WORLD);
  }
  printf("rank=%d size=%d host=%s netns=%s token=%d\n", rank, size, host, netns, token);
  MPI_Finalize();
  return 0;
}
