"""Float32 math that LLVM can vectorize (libm calls cannot be): erf and tanh.

Rational approximations (the ones Eigen and XLA use for float32), accurate to a few ulp.
"""

import numba
import numpy as np

F = np.float32


@numba.njit(inline="always", fastmath=True, cache=True)
def erf32(x):
    x = min(max(x, F(-4.0)), F(4.0))
    x2 = x * x
    p = F(-2.72614225801306e-10)
    p = p * x2 + F(2.77068142495902e-08)
    p = p * x2 + F(-2.10102402082508e-06)
    p = p * x2 + F(-5.69250639462346e-05)
    p = p * x2 + F(-7.34990630326855e-04)
    p = p * x2 + F(-2.95459980854025e-03)
    p = p * x2 + F(-1.60960333262415e-02)
    q = F(-1.45660718464996e-05)
    q = q * x2 + F(-2.13374055278905e-04)
    q = q * x2 + F(-1.68282697438203e-03)
    q = q * x2 + F(-7.37332916720468e-03)
    q = q * x2 + F(-1.42647390514189e-02)
    return x * p / q


@numba.njit(inline="always", fastmath=True, cache=True)
def tanh32(x):
    x = min(max(x, F(-7.90531110763549805)), F(7.90531110763549805))
    x2 = x * x
    p = F(-2.76076847742355e-16)
    p = p * x2 + F(2.00018790482477e-13)
    p = p * x2 + F(-8.60467152213735e-11)
    p = p * x2 + F(5.12229709037114e-08)
    p = p * x2 + F(1.48572235717979e-05)
    p = p * x2 + F(6.37261928875436e-04)
    p = p * x2 + F(4.89352455891786e-03)
    q = F(1.19825839466702e-06)
    q = q * x2 + F(1.18534705686654e-04)
    q = q * x2 + F(2.26843463243900e-03)
    q = q * x2 + F(4.89352518554385e-03)
    small = abs(x) < F(0.0004)
    return x if small else x * p / q
