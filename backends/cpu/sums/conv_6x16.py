"""The conv tile loop's block of sums for a tile of 6 x 16 (tiles.py), written by tools/make_tiles.py:
edit that, not this (tiles.py holds the SHA-256 of the sums, so that numba's disk cache compiles the loops again
when they change)."""

from __future__ import annotations

import numba
import numpy as np

from ..scalars import FAST

U = np.uint64


@numba.njit(fastmath=FAST - {"reassoc"}, error_model="numpy", boundscheck=False, forceinline=True)
def conv_6x16(x, q0, offs, k0, k1, w, b, t, at, bias, c0, fresh):
    if fresh:
        s0_0 = bias[c0 + U(0)]; s0_1 = bias[c0 + U(0)]; s0_2 = bias[c0 + U(0)]; s0_3 = bias[c0 + U(0)]; s0_4 = bias[c0 + U(0)]; s0_5 = bias[c0 + U(0)]; s0_6 = bias[c0 + U(0)]; s0_7 = bias[c0 + U(0)]; s0_8 = bias[c0 + U(0)]; s0_9 = bias[c0 + U(0)]; s0_10 = bias[c0 + U(0)]; s0_11 = bias[c0 + U(0)]; s0_12 = bias[c0 + U(0)]; s0_13 = bias[c0 + U(0)]; s0_14 = bias[c0 + U(0)]; s0_15 = bias[c0 + U(0)]
        s1_0 = bias[c0 + U(1)]; s1_1 = bias[c0 + U(1)]; s1_2 = bias[c0 + U(1)]; s1_3 = bias[c0 + U(1)]; s1_4 = bias[c0 + U(1)]; s1_5 = bias[c0 + U(1)]; s1_6 = bias[c0 + U(1)]; s1_7 = bias[c0 + U(1)]; s1_8 = bias[c0 + U(1)]; s1_9 = bias[c0 + U(1)]; s1_10 = bias[c0 + U(1)]; s1_11 = bias[c0 + U(1)]; s1_12 = bias[c0 + U(1)]; s1_13 = bias[c0 + U(1)]; s1_14 = bias[c0 + U(1)]; s1_15 = bias[c0 + U(1)]
        s2_0 = bias[c0 + U(2)]; s2_1 = bias[c0 + U(2)]; s2_2 = bias[c0 + U(2)]; s2_3 = bias[c0 + U(2)]; s2_4 = bias[c0 + U(2)]; s2_5 = bias[c0 + U(2)]; s2_6 = bias[c0 + U(2)]; s2_7 = bias[c0 + U(2)]; s2_8 = bias[c0 + U(2)]; s2_9 = bias[c0 + U(2)]; s2_10 = bias[c0 + U(2)]; s2_11 = bias[c0 + U(2)]; s2_12 = bias[c0 + U(2)]; s2_13 = bias[c0 + U(2)]; s2_14 = bias[c0 + U(2)]; s2_15 = bias[c0 + U(2)]
        s3_0 = bias[c0 + U(3)]; s3_1 = bias[c0 + U(3)]; s3_2 = bias[c0 + U(3)]; s3_3 = bias[c0 + U(3)]; s3_4 = bias[c0 + U(3)]; s3_5 = bias[c0 + U(3)]; s3_6 = bias[c0 + U(3)]; s3_7 = bias[c0 + U(3)]; s3_8 = bias[c0 + U(3)]; s3_9 = bias[c0 + U(3)]; s3_10 = bias[c0 + U(3)]; s3_11 = bias[c0 + U(3)]; s3_12 = bias[c0 + U(3)]; s3_13 = bias[c0 + U(3)]; s3_14 = bias[c0 + U(3)]; s3_15 = bias[c0 + U(3)]
        s4_0 = bias[c0 + U(4)]; s4_1 = bias[c0 + U(4)]; s4_2 = bias[c0 + U(4)]; s4_3 = bias[c0 + U(4)]; s4_4 = bias[c0 + U(4)]; s4_5 = bias[c0 + U(4)]; s4_6 = bias[c0 + U(4)]; s4_7 = bias[c0 + U(4)]; s4_8 = bias[c0 + U(4)]; s4_9 = bias[c0 + U(4)]; s4_10 = bias[c0 + U(4)]; s4_11 = bias[c0 + U(4)]; s4_12 = bias[c0 + U(4)]; s4_13 = bias[c0 + U(4)]; s4_14 = bias[c0 + U(4)]; s4_15 = bias[c0 + U(4)]
        s5_0 = bias[c0 + U(5)]; s5_1 = bias[c0 + U(5)]; s5_2 = bias[c0 + U(5)]; s5_3 = bias[c0 + U(5)]; s5_4 = bias[c0 + U(5)]; s5_5 = bias[c0 + U(5)]; s5_6 = bias[c0 + U(5)]; s5_7 = bias[c0 + U(5)]; s5_8 = bias[c0 + U(5)]; s5_9 = bias[c0 + U(5)]; s5_10 = bias[c0 + U(5)]; s5_11 = bias[c0 + U(5)]; s5_12 = bias[c0 + U(5)]; s5_13 = bias[c0 + U(5)]; s5_14 = bias[c0 + U(5)]; s5_15 = bias[c0 + U(5)]
    else:
        s0_0 = t[at + U(0)]; s0_1 = t[at + U(1)]; s0_2 = t[at + U(2)]; s0_3 = t[at + U(3)]; s0_4 = t[at + U(4)]; s0_5 = t[at + U(5)]; s0_6 = t[at + U(6)]; s0_7 = t[at + U(7)]; s0_8 = t[at + U(8)]; s0_9 = t[at + U(9)]; s0_10 = t[at + U(10)]; s0_11 = t[at + U(11)]; s0_12 = t[at + U(12)]; s0_13 = t[at + U(13)]; s0_14 = t[at + U(14)]; s0_15 = t[at + U(15)]
        s1_0 = t[at + U(16)]; s1_1 = t[at + U(17)]; s1_2 = t[at + U(18)]; s1_3 = t[at + U(19)]; s1_4 = t[at + U(20)]; s1_5 = t[at + U(21)]; s1_6 = t[at + U(22)]; s1_7 = t[at + U(23)]; s1_8 = t[at + U(24)]; s1_9 = t[at + U(25)]; s1_10 = t[at + U(26)]; s1_11 = t[at + U(27)]; s1_12 = t[at + U(28)]; s1_13 = t[at + U(29)]; s1_14 = t[at + U(30)]; s1_15 = t[at + U(31)]
        s2_0 = t[at + U(32)]; s2_1 = t[at + U(33)]; s2_2 = t[at + U(34)]; s2_3 = t[at + U(35)]; s2_4 = t[at + U(36)]; s2_5 = t[at + U(37)]; s2_6 = t[at + U(38)]; s2_7 = t[at + U(39)]; s2_8 = t[at + U(40)]; s2_9 = t[at + U(41)]; s2_10 = t[at + U(42)]; s2_11 = t[at + U(43)]; s2_12 = t[at + U(44)]; s2_13 = t[at + U(45)]; s2_14 = t[at + U(46)]; s2_15 = t[at + U(47)]
        s3_0 = t[at + U(48)]; s3_1 = t[at + U(49)]; s3_2 = t[at + U(50)]; s3_3 = t[at + U(51)]; s3_4 = t[at + U(52)]; s3_5 = t[at + U(53)]; s3_6 = t[at + U(54)]; s3_7 = t[at + U(55)]; s3_8 = t[at + U(56)]; s3_9 = t[at + U(57)]; s3_10 = t[at + U(58)]; s3_11 = t[at + U(59)]; s3_12 = t[at + U(60)]; s3_13 = t[at + U(61)]; s3_14 = t[at + U(62)]; s3_15 = t[at + U(63)]
        s4_0 = t[at + U(64)]; s4_1 = t[at + U(65)]; s4_2 = t[at + U(66)]; s4_3 = t[at + U(67)]; s4_4 = t[at + U(68)]; s4_5 = t[at + U(69)]; s4_6 = t[at + U(70)]; s4_7 = t[at + U(71)]; s4_8 = t[at + U(72)]; s4_9 = t[at + U(73)]; s4_10 = t[at + U(74)]; s4_11 = t[at + U(75)]; s4_12 = t[at + U(76)]; s4_13 = t[at + U(77)]; s4_14 = t[at + U(78)]; s4_15 = t[at + U(79)]
        s5_0 = t[at + U(80)]; s5_1 = t[at + U(81)]; s5_2 = t[at + U(82)]; s5_3 = t[at + U(83)]; s5_4 = t[at + U(84)]; s5_5 = t[at + U(85)]; s5_6 = t[at + U(86)]; s5_7 = t[at + U(87)]; s5_8 = t[at + U(88)]; s5_9 = t[at + U(89)]; s5_10 = t[at + U(90)]; s5_11 = t[at + U(91)]; s5_12 = t[at + U(92)]; s5_13 = t[at + U(93)]; s5_14 = t[at + U(94)]; s5_15 = t[at + U(95)]
    for k in range(k0, k1):
        q = offs[k] + q0
        x0 = x[q + U(0)]; x1 = x[q + U(1)]; x2 = x[q + U(2)]; x3 = x[q + U(3)]; x4 = x[q + U(4)]; x5 = x[q + U(5)]; x6 = x[q + U(6)]; x7 = x[q + U(7)]; x8 = x[q + U(8)]; x9 = x[q + U(9)]; x10 = x[q + U(10)]; x11 = x[q + U(11)]; x12 = x[q + U(12)]; x13 = x[q + U(13)]; x14 = x[q + U(14)]; x15 = x[q + U(15)]
        a = w[b, k, U(0)]
        s0_0 += a * x0; s0_1 += a * x1; s0_2 += a * x2; s0_3 += a * x3; s0_4 += a * x4; s0_5 += a * x5; s0_6 += a * x6; s0_7 += a * x7; s0_8 += a * x8; s0_9 += a * x9; s0_10 += a * x10; s0_11 += a * x11; s0_12 += a * x12; s0_13 += a * x13; s0_14 += a * x14; s0_15 += a * x15
        a = w[b, k, U(1)]
        s1_0 += a * x0; s1_1 += a * x1; s1_2 += a * x2; s1_3 += a * x3; s1_4 += a * x4; s1_5 += a * x5; s1_6 += a * x6; s1_7 += a * x7; s1_8 += a * x8; s1_9 += a * x9; s1_10 += a * x10; s1_11 += a * x11; s1_12 += a * x12; s1_13 += a * x13; s1_14 += a * x14; s1_15 += a * x15
        a = w[b, k, U(2)]
        s2_0 += a * x0; s2_1 += a * x1; s2_2 += a * x2; s2_3 += a * x3; s2_4 += a * x4; s2_5 += a * x5; s2_6 += a * x6; s2_7 += a * x7; s2_8 += a * x8; s2_9 += a * x9; s2_10 += a * x10; s2_11 += a * x11; s2_12 += a * x12; s2_13 += a * x13; s2_14 += a * x14; s2_15 += a * x15
        a = w[b, k, U(3)]
        s3_0 += a * x0; s3_1 += a * x1; s3_2 += a * x2; s3_3 += a * x3; s3_4 += a * x4; s3_5 += a * x5; s3_6 += a * x6; s3_7 += a * x7; s3_8 += a * x8; s3_9 += a * x9; s3_10 += a * x10; s3_11 += a * x11; s3_12 += a * x12; s3_13 += a * x13; s3_14 += a * x14; s3_15 += a * x15
        a = w[b, k, U(4)]
        s4_0 += a * x0; s4_1 += a * x1; s4_2 += a * x2; s4_3 += a * x3; s4_4 += a * x4; s4_5 += a * x5; s4_6 += a * x6; s4_7 += a * x7; s4_8 += a * x8; s4_9 += a * x9; s4_10 += a * x10; s4_11 += a * x11; s4_12 += a * x12; s4_13 += a * x13; s4_14 += a * x14; s4_15 += a * x15
        a = w[b, k, U(5)]
        s5_0 += a * x0; s5_1 += a * x1; s5_2 += a * x2; s5_3 += a * x3; s5_4 += a * x4; s5_5 += a * x5; s5_6 += a * x6; s5_7 += a * x7; s5_8 += a * x8; s5_9 += a * x9; s5_10 += a * x10; s5_11 += a * x11; s5_12 += a * x12; s5_13 += a * x13; s5_14 += a * x14; s5_15 += a * x15
    t[at + U(0)] = s0_0; t[at + U(1)] = s0_1; t[at + U(2)] = s0_2; t[at + U(3)] = s0_3; t[at + U(4)] = s0_4; t[at + U(5)] = s0_5; t[at + U(6)] = s0_6; t[at + U(7)] = s0_7; t[at + U(8)] = s0_8; t[at + U(9)] = s0_9; t[at + U(10)] = s0_10; t[at + U(11)] = s0_11; t[at + U(12)] = s0_12; t[at + U(13)] = s0_13; t[at + U(14)] = s0_14; t[at + U(15)] = s0_15
    t[at + U(16)] = s1_0; t[at + U(17)] = s1_1; t[at + U(18)] = s1_2; t[at + U(19)] = s1_3; t[at + U(20)] = s1_4; t[at + U(21)] = s1_5; t[at + U(22)] = s1_6; t[at + U(23)] = s1_7; t[at + U(24)] = s1_8; t[at + U(25)] = s1_9; t[at + U(26)] = s1_10; t[at + U(27)] = s1_11; t[at + U(28)] = s1_12; t[at + U(29)] = s1_13; t[at + U(30)] = s1_14; t[at + U(31)] = s1_15
    t[at + U(32)] = s2_0; t[at + U(33)] = s2_1; t[at + U(34)] = s2_2; t[at + U(35)] = s2_3; t[at + U(36)] = s2_4; t[at + U(37)] = s2_5; t[at + U(38)] = s2_6; t[at + U(39)] = s2_7; t[at + U(40)] = s2_8; t[at + U(41)] = s2_9; t[at + U(42)] = s2_10; t[at + U(43)] = s2_11; t[at + U(44)] = s2_12; t[at + U(45)] = s2_13; t[at + U(46)] = s2_14; t[at + U(47)] = s2_15
    t[at + U(48)] = s3_0; t[at + U(49)] = s3_1; t[at + U(50)] = s3_2; t[at + U(51)] = s3_3; t[at + U(52)] = s3_4; t[at + U(53)] = s3_5; t[at + U(54)] = s3_6; t[at + U(55)] = s3_7; t[at + U(56)] = s3_8; t[at + U(57)] = s3_9; t[at + U(58)] = s3_10; t[at + U(59)] = s3_11; t[at + U(60)] = s3_12; t[at + U(61)] = s3_13; t[at + U(62)] = s3_14; t[at + U(63)] = s3_15
    t[at + U(64)] = s4_0; t[at + U(65)] = s4_1; t[at + U(66)] = s4_2; t[at + U(67)] = s4_3; t[at + U(68)] = s4_4; t[at + U(69)] = s4_5; t[at + U(70)] = s4_6; t[at + U(71)] = s4_7; t[at + U(72)] = s4_8; t[at + U(73)] = s4_9; t[at + U(74)] = s4_10; t[at + U(75)] = s4_11; t[at + U(76)] = s4_12; t[at + U(77)] = s4_13; t[at + U(78)] = s4_14; t[at + U(79)] = s4_15
    t[at + U(80)] = s5_0; t[at + U(81)] = s5_1; t[at + U(82)] = s5_2; t[at + U(83)] = s5_3; t[at + U(84)] = s5_4; t[at + U(85)] = s5_5; t[at + U(86)] = s5_6; t[at + U(87)] = s5_7; t[at + U(88)] = s5_8; t[at + U(89)] = s5_9; t[at + U(90)] = s5_10; t[at + U(91)] = s5_11; t[at + U(92)] = s5_12; t[at + U(93)] = s5_13; t[at + U(94)] = s5_14; t[at + U(95)] = s5_15
