// A convolution's shapes (ops/conv.py packs them), for conv.comp, conv_gemm.comp and convt.comp: word i of
// the layer's push constants as specialization constant 16 + i (device.py SPECIALIZED), so the driver
// folds them: the index arithmetic divides by constants, and the tap loops have fixed counts.
layout(constant_id = 16) const int N = 1;
layout(constant_id = 17) const int C = 1;
layout(constant_id = 18) const int H = 1;
layout(constant_id = 19) const int W = 1;
layout(constant_id = 20) const int CO = 1;
layout(constant_id = 21) const int OH = 1;
layout(constant_id = 22) const int OW = 1;
layout(constant_id = 23) const int KH = 1;
layout(constant_id = 24) const int KW = 1;
layout(constant_id = 25) const int SH = 1;
layout(constant_id = 26) const int SW = 1;
layout(constant_id = 27) const int DH = 1;
layout(constant_id = 28) const int DW = 1;
layout(constant_id = 29) const int PH = 0;  // the pads at the start (ConvTranspose: its heads)
layout(constant_id = 30) const int PW = 0;
layout(constant_id = 31) const int G = 1;
layout(constant_id = 32) const int HAS_BIAS = 0;
layout(constant_id = 33) const float ALPHA = 0.0;  // the fused activation's parameters
layout(constant_id = 34) const float BETA = 0.0;
layout(constant_id = 35) const int BLOCKS = 1;  // conv.comp's output-channel blocks of 4 per group
