//! fp32 <-> bf16 / fp16 bit patterns (round to nearest, ties to even), for
//! filling [`crate::Features::bf16`] / [`crate::Features::f16`] and reading
//! 16-bit gradients. Widening is exact.

/// fp32 -> bf16 bits, round to nearest even; NaN stays a quiet NaN.
pub fn bf16_from_f32(x: f32) -> u16 {
    let bits = x.to_bits();
    if x.is_nan() {
        return ((bits >> 16) as u16) | 0x0040;
    }
    let round = 0x7fff + ((bits >> 16) & 1);
    ((bits + round) >> 16) as u16 // overflow carries into the exponent: Inf
}

/// bf16 bits -> fp32 (exact).
pub fn bf16_to_f32(h: u16) -> f32 {
    f32::from_bits((h as u32) << 16)
}

/// fp32 -> IEEE binary16 bits, round to nearest even, overflow to Inf.
pub fn f16_from_f32(x: f32) -> u16 {
    let bits = x.to_bits();
    let sign = ((bits >> 16) & 0x8000) as u16;
    let a = bits & 0x7fff_ffff;
    if a > 0x7f80_0000 {
        return sign | 0x7e00; // NaN
    }
    if a >= 0x4780_0000 {
        return sign | 0x7c00; // >= 65536 (and Inf): Inf
    }
    if a < 0x3880_0000 {
        // Below 2^-14: a subnormal multiple of 2^-24. Adding 0.5 (whose ulp
        // is 2^-24) lets the FPU round to nearest even.
        let sum = f32::from_bits(a) + 0.5;
        return sign | (sum.to_bits() - 0x3f00_0000) as u16;
    }
    let odd = (a >> 13) & 1;
    let rebased = a.wrapping_sub((127 - 15) << 23) + 0xfff + odd;
    sign | (rebased >> 13) as u16 // mantissa overflow carries into the exponent
}

/// IEEE binary16 bits -> fp32 (exact).
pub fn f16_to_f32(h: u16) -> f32 {
    let sign = ((h as u32) & 0x8000) << 16;
    let exponent = ((h >> 10) & 0x1f) as u32;
    let mantissa = (h & 0x3ff) as u32;
    let magnitude = match exponent {
        0 => mantissa as f32 * (1.0 / 16_777_216.0), // subnormal: m * 2^-24, exact
        31 => f32::from_bits(0x7f80_0000 | (mantissa << 13)),
        _ => f32::from_bits(((exponent + 112) << 23) | (mantissa << 13)),
    };
    f32::from_bits(sign | magnitude.to_bits())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rounds |x| to `precision` significant bits with spacing fixed below
    /// 2^min_exp (the format's smallest normal), ties to even, in f64:
    /// written from the formats' definitions, not from the bit tricks.
    fn round_format(x: f64, precision: i32, min_exp: i32) -> f64 {
        if x == 0.0 {
            return 0.0;
        }
        let e = ((((x.to_bits() >> 52) & 0x7ff) as i32) - 1023).max(min_exp); // x is a normal f64
        let spacing = 2f64.powi(e - (precision - 1));
        let q = x / spacing;
        let mut r = q.round();
        if q - q.floor() == 0.5 && r % 2.0 != 0.0 {
            r -= 1.0; // tie: to even
        }
        r * spacing
    }

    fn reference_f16(x: f32) -> f64 {
        let r = round_format((x as f64).abs(), 11, -14);
        let r = if r >= 65536.0 { f64::INFINITY } else { r };
        if x.is_sign_negative() {
            -r
        } else {
            r
        }
    }

    fn reference_bf16(x: f32) -> f64 {
        let r = round_format((x as f64).abs(), 8, -126);
        let r = if r >= 2f64.powi(128) { f64::INFINITY } else { r };
        if x.is_sign_negative() {
            -r
        } else {
            r
        }
    }

    /// Every 16-bit pattern widens and narrows back to itself (NaN: to NaN).
    #[test]
    fn round_trips_every_pattern() {
        for h in 0..=u16::MAX {
            let f = f16_to_f32(h);
            if f.is_nan() {
                assert!(f16_to_f32(f16_from_f32(f)).is_nan());
            } else {
                assert_eq!(f16_from_f32(f), h, "f16 {:#06x}", h);
            }
            let b = bf16_to_f32(h);
            if b.is_nan() {
                assert!(bf16_to_f32(bf16_from_f32(b)).is_nan());
            } else {
                assert_eq!(bf16_from_f32(b), h, "bf16 {:#06x}", h);
            }
        }
    }

    /// Narrowing matches the f64 definition on a sweep of fp32 values
    /// (every 4099th pattern: all exponents, ties, subnormals, overflow).
    #[test]
    fn narrowing_matches_definition() {
        let mut bits: u32 = 0;
        while bits < 0x7f80_0000 {
            for x in [f32::from_bits(bits), -f32::from_bits(bits)] {
                assert_eq!(f16_to_f32(f16_from_f32(x)) as f64, reference_f16(x), "f16 of {:e}", x);
                assert_eq!(bf16_to_f32(bf16_from_f32(x)) as f64, reference_bf16(x), "bf16 of {:e}", x);
            }
            bits += 4099;
        }
        // ties, both directions, and the edges
        for (x, want) in [
            (1.0 + 2f32.powi(-11), 1.0),
            (1.0 + 3.0 * 2f32.powi(-11), 1.0 + 2f32.powi(-9)),
            (65504.0, 65504.0),
            (65519.99, 65504.0),
            (65520.0, f32::INFINITY),
            (2f32.powi(-25), 0.0),
            (3.0 * 2f32.powi(-25), 2f32.powi(-23)),
        ] {
            assert_eq!(f16_to_f32(f16_from_f32(x)), want, "f16 of {:e}", x);
        }
        assert_eq!(bf16_to_f32(bf16_from_f32(1.0 + 2f32.powi(-8))), 1.0);
        assert_eq!(bf16_to_f32(bf16_from_f32(1.0 + 3.0 * 2f32.powi(-8))), 1.0 + 2f32.powi(-6));
        assert_eq!(bf16_to_f32(bf16_from_f32(f32::MAX)), f32::INFINITY);
    }
}
