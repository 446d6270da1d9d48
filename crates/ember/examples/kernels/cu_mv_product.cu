// The lessons' matrix-vector product: one thread per row of the row-major
// rows x cols matrix m, y[r] = sum over j of m[r][j] * x[j].
extern "C" __global__ void cu_mv_product(const float* m, const float* x, float* y, int rows, int cols) {
    int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r < rows) {
        float s = 0.0f;
        for (int j = 0; j < cols; ++j) s += m[(long long)r * cols + j] * x[j];
        y[r] = s;
    }
}
