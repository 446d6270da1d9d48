// The lessons' vector add: one thread per element, c[i] = a[i] + b[i].
extern "C" __global__ void cu_add_vectors(const float* a, const float* b, float* c, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) c[i] = a[i] + b[i];
}
