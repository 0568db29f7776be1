/* Cast between dtypes: -DSRC/-DDST are the OpenCL types; -DSRC_HALF/-DDST_HALF
 * mark half storage (read and written through vload_half/vstore_half);
 * -DTO_BOOL writes x != 0. */

__kernel void cast(BUF(const SRC, x), BUF(DST, y), const int n) {
    const int i = get_global_id(0);
    if (i >= n) return;
    SHIFT(x); SHIFT(y);
#ifdef SRC_HALF
    const float v = vload_half(i, x);
#else
    const SRC v = x[i];
#endif
#if defined(TO_BOOL)
    y[i] = v != 0;
#elif defined(DST_HALF)
    vstore_half((float)v, i, y);
#else
    y[i] = (DST)v;
#endif
}
