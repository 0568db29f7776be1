/* The raster (ops/raster.py): one region of aiomnn.geometry's rasters per launch, each a copy from a 3-D strided
 * view of x into a 3-D strided view of y, offsets and strides in elements. Built per element size
 * (-DE=uchar/ushort/uint/ulong) like copy.cl, so it serves every dtype the backend stores, fp16 storage included:
 * it moves elements and never converts them. */

/* Work item (k, j, i) copies element [i][j][k] of the region: the innermost size along dimension 0, the one work
 * groups are widest along, so neighbouring work items touch neighbouring elements where the views are dense. */
__kernel void raster(BUF(const E, x), BUF(E, y), const int x_at, const int xs0, const int xs1, const int xs2,
                     const int y_at, const int ys0, const int ys1, const int ys2,
                     const int n0, const int n1, const int n2) {
    const int k = get_global_id(0), j = get_global_id(1), i = get_global_id(2);
    if (k >= n2 || j >= n1 || i >= n0) return;
    SHIFT(x); SHIFT(y);
    y[y_at + i * ys0 + j * ys1 + k * ys2] = x[x_at + i * xs0 + j * xs1 + k * xs2];
}

/* A raster's fill (Pad's constant), written over the whole output before its regions: `value` holds the fill's
 * bits in the output's storage type, so no conversion happens here either. */
__kernel void fill(BUF(E, y), const int n, const E value) {
    const int i = get_global_id(0);
    if (i >= n) return;
    SHIFT(y);
    y[i] = value;
}
