"""The channels tile loop's block of sums for a tile of 6 x 16 (tiles.py), written by tools/make_tiles.py:
edit that, not this (tiles.py holds the SHA-256 of the sums, so that numba's disk cache compiles the loops again
when they change)."""

from __future__ import annotations

import numba
import numpy as np

from ..scalars import FAST, prefetch

U = np.uint64


@numba.njit(fastmath=FAST - {"reassoc"}, error_model="numpy", boundscheck=False, forceinline=True)
def channels_6x16(x, qs, offs, wp, p, kk, t, bias, n0, flat, at):
    q0 = qs[0]; q1 = qs[1]; q2 = qs[2]; q3 = qs[3]; q4 = qs[4]; q5 = qs[5]
    s0_0 = bias[n0 + U(0)]; s0_1 = bias[n0 + U(1)]; s0_2 = bias[n0 + U(2)]; s0_3 = bias[n0 + U(3)]; s0_4 = bias[n0 + U(4)]; s0_5 = bias[n0 + U(5)]; s0_6 = bias[n0 + U(6)]; s0_7 = bias[n0 + U(7)]; s0_8 = bias[n0 + U(8)]; s0_9 = bias[n0 + U(9)]; s0_10 = bias[n0 + U(10)]; s0_11 = bias[n0 + U(11)]; s0_12 = bias[n0 + U(12)]; s0_13 = bias[n0 + U(13)]; s0_14 = bias[n0 + U(14)]; s0_15 = bias[n0 + U(15)]
    s1_0 = bias[n0 + U(0)]; s1_1 = bias[n0 + U(1)]; s1_2 = bias[n0 + U(2)]; s1_3 = bias[n0 + U(3)]; s1_4 = bias[n0 + U(4)]; s1_5 = bias[n0 + U(5)]; s1_6 = bias[n0 + U(6)]; s1_7 = bias[n0 + U(7)]; s1_8 = bias[n0 + U(8)]; s1_9 = bias[n0 + U(9)]; s1_10 = bias[n0 + U(10)]; s1_11 = bias[n0 + U(11)]; s1_12 = bias[n0 + U(12)]; s1_13 = bias[n0 + U(13)]; s1_14 = bias[n0 + U(14)]; s1_15 = bias[n0 + U(15)]
    s2_0 = bias[n0 + U(0)]; s2_1 = bias[n0 + U(1)]; s2_2 = bias[n0 + U(2)]; s2_3 = bias[n0 + U(3)]; s2_4 = bias[n0 + U(4)]; s2_5 = bias[n0 + U(5)]; s2_6 = bias[n0 + U(6)]; s2_7 = bias[n0 + U(7)]; s2_8 = bias[n0 + U(8)]; s2_9 = bias[n0 + U(9)]; s2_10 = bias[n0 + U(10)]; s2_11 = bias[n0 + U(11)]; s2_12 = bias[n0 + U(12)]; s2_13 = bias[n0 + U(13)]; s2_14 = bias[n0 + U(14)]; s2_15 = bias[n0 + U(15)]
    s3_0 = bias[n0 + U(0)]; s3_1 = bias[n0 + U(1)]; s3_2 = bias[n0 + U(2)]; s3_3 = bias[n0 + U(3)]; s3_4 = bias[n0 + U(4)]; s3_5 = bias[n0 + U(5)]; s3_6 = bias[n0 + U(6)]; s3_7 = bias[n0 + U(7)]; s3_8 = bias[n0 + U(8)]; s3_9 = bias[n0 + U(9)]; s3_10 = bias[n0 + U(10)]; s3_11 = bias[n0 + U(11)]; s3_12 = bias[n0 + U(12)]; s3_13 = bias[n0 + U(13)]; s3_14 = bias[n0 + U(14)]; s3_15 = bias[n0 + U(15)]
    s4_0 = bias[n0 + U(0)]; s4_1 = bias[n0 + U(1)]; s4_2 = bias[n0 + U(2)]; s4_3 = bias[n0 + U(3)]; s4_4 = bias[n0 + U(4)]; s4_5 = bias[n0 + U(5)]; s4_6 = bias[n0 + U(6)]; s4_7 = bias[n0 + U(7)]; s4_8 = bias[n0 + U(8)]; s4_9 = bias[n0 + U(9)]; s4_10 = bias[n0 + U(10)]; s4_11 = bias[n0 + U(11)]; s4_12 = bias[n0 + U(12)]; s4_13 = bias[n0 + U(13)]; s4_14 = bias[n0 + U(14)]; s4_15 = bias[n0 + U(15)]
    s5_0 = bias[n0 + U(0)]; s5_1 = bias[n0 + U(1)]; s5_2 = bias[n0 + U(2)]; s5_3 = bias[n0 + U(3)]; s5_4 = bias[n0 + U(4)]; s5_5 = bias[n0 + U(5)]; s5_6 = bias[n0 + U(6)]; s5_7 = bias[n0 + U(7)]; s5_8 = bias[n0 + U(8)]; s5_9 = bias[n0 + U(9)]; s5_10 = bias[n0 + U(10)]; s5_11 = bias[n0 + U(11)]; s5_12 = bias[n0 + U(12)]; s5_13 = bias[n0 + U(13)]; s5_14 = bias[n0 + U(14)]; s5_15 = bias[n0 + U(15)]
    for k in range(U(0), kk):
        o = offs[k]
        prefetch(flat, at + k * U(16) + U(2048))
        w0 = wp[p, k, U(0)]; w1 = wp[p, k, U(1)]; w2 = wp[p, k, U(2)]; w3 = wp[p, k, U(3)]; w4 = wp[p, k, U(4)]; w5 = wp[p, k, U(5)]; w6 = wp[p, k, U(6)]; w7 = wp[p, k, U(7)]; w8 = wp[p, k, U(8)]; w9 = wp[p, k, U(9)]; w10 = wp[p, k, U(10)]; w11 = wp[p, k, U(11)]; w12 = wp[p, k, U(12)]; w13 = wp[p, k, U(13)]; w14 = wp[p, k, U(14)]; w15 = wp[p, k, U(15)]
        a = x[o + q0]
        s0_0 += a * w0; s0_1 += a * w1; s0_2 += a * w2; s0_3 += a * w3; s0_4 += a * w4; s0_5 += a * w5; s0_6 += a * w6; s0_7 += a * w7; s0_8 += a * w8; s0_9 += a * w9; s0_10 += a * w10; s0_11 += a * w11; s0_12 += a * w12; s0_13 += a * w13; s0_14 += a * w14; s0_15 += a * w15
        a = x[o + q1]
        s1_0 += a * w0; s1_1 += a * w1; s1_2 += a * w2; s1_3 += a * w3; s1_4 += a * w4; s1_5 += a * w5; s1_6 += a * w6; s1_7 += a * w7; s1_8 += a * w8; s1_9 += a * w9; s1_10 += a * w10; s1_11 += a * w11; s1_12 += a * w12; s1_13 += a * w13; s1_14 += a * w14; s1_15 += a * w15
        a = x[o + q2]
        s2_0 += a * w0; s2_1 += a * w1; s2_2 += a * w2; s2_3 += a * w3; s2_4 += a * w4; s2_5 += a * w5; s2_6 += a * w6; s2_7 += a * w7; s2_8 += a * w8; s2_9 += a * w9; s2_10 += a * w10; s2_11 += a * w11; s2_12 += a * w12; s2_13 += a * w13; s2_14 += a * w14; s2_15 += a * w15
        a = x[o + q3]
        s3_0 += a * w0; s3_1 += a * w1; s3_2 += a * w2; s3_3 += a * w3; s3_4 += a * w4; s3_5 += a * w5; s3_6 += a * w6; s3_7 += a * w7; s3_8 += a * w8; s3_9 += a * w9; s3_10 += a * w10; s3_11 += a * w11; s3_12 += a * w12; s3_13 += a * w13; s3_14 += a * w14; s3_15 += a * w15
        a = x[o + q4]
        s4_0 += a * w0; s4_1 += a * w1; s4_2 += a * w2; s4_3 += a * w3; s4_4 += a * w4; s4_5 += a * w5; s4_6 += a * w6; s4_7 += a * w7; s4_8 += a * w8; s4_9 += a * w9; s4_10 += a * w10; s4_11 += a * w11; s4_12 += a * w12; s4_13 += a * w13; s4_14 += a * w14; s4_15 += a * w15
        a = x[o + q5]
        s5_0 += a * w0; s5_1 += a * w1; s5_2 += a * w2; s5_3 += a * w3; s5_4 += a * w4; s5_5 += a * w5; s5_6 += a * w6; s5_7 += a * w7; s5_8 += a * w8; s5_9 += a * w9; s5_10 += a * w10; s5_11 += a * w11; s5_12 += a * w12; s5_13 += a * w13; s5_14 += a * w14; s5_15 += a * w15
    t[U(0)] = s0_0; t[U(1)] = s0_1; t[U(2)] = s0_2; t[U(3)] = s0_3; t[U(4)] = s0_4; t[U(5)] = s0_5; t[U(6)] = s0_6; t[U(7)] = s0_7; t[U(8)] = s0_8; t[U(9)] = s0_9; t[U(10)] = s0_10; t[U(11)] = s0_11; t[U(12)] = s0_12; t[U(13)] = s0_13; t[U(14)] = s0_14; t[U(15)] = s0_15
    t[U(16)] = s1_0; t[U(17)] = s1_1; t[U(18)] = s1_2; t[U(19)] = s1_3; t[U(20)] = s1_4; t[U(21)] = s1_5; t[U(22)] = s1_6; t[U(23)] = s1_7; t[U(24)] = s1_8; t[U(25)] = s1_9; t[U(26)] = s1_10; t[U(27)] = s1_11; t[U(28)] = s1_12; t[U(29)] = s1_13; t[U(30)] = s1_14; t[U(31)] = s1_15
    t[U(32)] = s2_0; t[U(33)] = s2_1; t[U(34)] = s2_2; t[U(35)] = s2_3; t[U(36)] = s2_4; t[U(37)] = s2_5; t[U(38)] = s2_6; t[U(39)] = s2_7; t[U(40)] = s2_8; t[U(41)] = s2_9; t[U(42)] = s2_10; t[U(43)] = s2_11; t[U(44)] = s2_12; t[U(45)] = s2_13; t[U(46)] = s2_14; t[U(47)] = s2_15
    t[U(48)] = s3_0; t[U(49)] = s3_1; t[U(50)] = s3_2; t[U(51)] = s3_3; t[U(52)] = s3_4; t[U(53)] = s3_5; t[U(54)] = s3_6; t[U(55)] = s3_7; t[U(56)] = s3_8; t[U(57)] = s3_9; t[U(58)] = s3_10; t[U(59)] = s3_11; t[U(60)] = s3_12; t[U(61)] = s3_13; t[U(62)] = s3_14; t[U(63)] = s3_15
    t[U(64)] = s4_0; t[U(65)] = s4_1; t[U(66)] = s4_2; t[U(67)] = s4_3; t[U(68)] = s4_4; t[U(69)] = s4_5; t[U(70)] = s4_6; t[U(71)] = s4_7; t[U(72)] = s4_8; t[U(73)] = s4_9; t[U(74)] = s4_10; t[U(75)] = s4_11; t[U(76)] = s4_12; t[U(77)] = s4_13; t[U(78)] = s4_14; t[U(79)] = s4_15
    t[U(80)] = s5_0; t[U(81)] = s5_1; t[U(82)] = s5_2; t[U(83)] = s5_3; t[U(84)] = s5_4; t[U(85)] = s5_5; t[U(86)] = s5_6; t[U(87)] = s5_7; t[U(88)] = s5_8; t[U(89)] = s5_9; t[U(90)] = s5_10; t[U(91)] = s5_11; t[U(92)] = s5_12; t[U(93)] = s5_13; t[U(94)] = s5_14; t[U(95)] = s5_15
