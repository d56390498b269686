//! How figures tell targets and stages apart: one hue family per framework
//! (tensorwire blues, the in-process baseline magenta, raw floors greys,
//! ttrpc greens, gRPC oranges), a lightness and a marker per transport, and
//! a color per request stage grouped by where the stage runs (client blues,
//! transport oranges, agent greens, queue lavender, compute red).

use plotters::style::RGBColor;

/// A marker shape, one per transport.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Marker {
    /// Filled circle (`shm`).
    Circle,
    /// Filled triangle (`unix`).
    Triangle,
    /// Filled square (`tcp`).
    Square,
    /// Open circle (`tcp?nodelay=0`).
    Ring,
    /// Cross (`inproc`).
    Cross,
    /// Filled diamond (`none`: the engine in this process, and others).
    Diamond,
}

/// The color and marker of one target's lines.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SeriesStyle {
    /// Line and marker color.
    pub color: RGBColor,
    /// Marker shape.
    pub marker: Marker,
}

/// Transports in display order.
const TRANSPORTS: [&str; 6] = ["none", "inproc", "shm", "unix", "tcp", "tcp?nodelay=0"];

/// Frameworks in display order.
const FRAMEWORKS: [&str; 5] = ["tensorwire", "local", "raw", "ttrpc", "grpc"];

/// Sort key of a target: framework, then transport, in display order.
pub fn target_rank(framework: &str, transport: &str) -> (usize, usize) {
    let f = FRAMEWORKS
        .iter()
        .position(|x| *x == framework)
        .unwrap_or(FRAMEWORKS.len());
    let t = TRANSPORTS
        .iter()
        .position(|x| *x == transport)
        .unwrap_or(TRANSPORTS.len());
    (f, t)
}

/// The style of a target's series, from its framework and transport.
pub fn target_style(framework: &str, transport: &str) -> SeriesStyle {
    let t = TRANSPORTS
        .iter()
        .position(|x| *x == transport)
        .unwrap_or(TRANSPORTS.len());
    // One shade per transport, darkest for the fastest transports.
    let shades: [RGBColor; 7] = match framework {
        "tensorwire" => [
            RGBColor(0x5a, 0x4f, 0xcf),
            RGBColor(0x5a, 0x4f, 0xcf),
            RGBColor(0x10, 0x30, 0xa8),
            RGBColor(0x1f, 0x78, 0xd0),
            RGBColor(0x14, 0xa5, 0xc8),
            RGBColor(0x7f, 0xbf, 0xef),
            RGBColor(0x1f, 0x78, 0xd0),
        ],
        "local" => [RGBColor(0xa0, 0x30, 0x6e); 7],
        "raw" => [
            RGBColor(0x48, 0x48, 0x48),
            RGBColor(0x48, 0x48, 0x48),
            RGBColor(0x48, 0x48, 0x48),
            RGBColor(0x80, 0x80, 0x80),
            RGBColor(0xa8, 0xa8, 0xa8),
            RGBColor(0xc4, 0xc4, 0xc4),
            RGBColor(0x90, 0x90, 0x90),
        ],
        "ttrpc" => [
            RGBColor(0x0b, 0x6e, 0x4f),
            RGBColor(0x0b, 0x6e, 0x4f),
            RGBColor(0x0b, 0x6e, 0x4f),
            RGBColor(0x1b, 0x9e, 0x5a),
            RGBColor(0x5c, 0xc2, 0x7a),
            RGBColor(0x9a, 0xd8, 0x8e),
            RGBColor(0x1b, 0x9e, 0x5a),
        ],
        "grpc" => [
            RGBColor(0xb3, 0x40, 0x00),
            RGBColor(0xb3, 0x40, 0x00),
            RGBColor(0xb3, 0x40, 0x00),
            RGBColor(0xe0, 0x60, 0x10),
            RGBColor(0xf5, 0x90, 0x30),
            RGBColor(0xfb, 0xb8, 0x68),
            RGBColor(0xe0, 0x60, 0x10),
        ],
        _ => [RGBColor(0x8c, 0x6d, 0x31); 7],
    };
    let marker = match transport {
        "shm" => Marker::Circle,
        "unix" => Marker::Triangle,
        "tcp" => Marker::Square,
        "tcp?nodelay=0" => Marker::Ring,
        "inproc" => Marker::Cross,
        _ => Marker::Diamond,
    };
    SeriesStyle {
        color: shades[t.min(shades.len() - 1)],
        marker,
    }
}

/// The color of a request stage (by [`crate::Stage::name`]); stages not
/// known get a neutral grey.
pub fn stage_color(stage: &str) -> RGBColor {
    match stage {
        "client_send" => RGBColor(0x9e, 0xca, 0xe1),
        "to_agent" => RGBColor(0xfd, 0x8d, 0x3c),
        "agent_prepare" => RGBColor(0xa1, 0xd9, 0x9b),
        "queue" => RGBColor(0xbc, 0xbd, 0xdc),
        "compute" => RGBColor(0xd6, 0x27, 0x28),
        "agent_respond" => RGBColor(0x31, 0xa3, 0x54),
        "to_client" => RGBColor(0xd9, 0x48, 0x01),
        "client_receive" => RGBColor(0x31, 0x82, 0xbd),
        _ => RGBColor(0x99, 0x99, 0x99),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frameworks_keep_their_hue_and_transports_differ() {
        let a = target_style("tensorwire", "shm");
        let b = target_style("tensorwire", "unix");
        let c = target_style("raw", "unix");
        assert_ne!(a.color, b.color);
        assert_ne!(a.marker, b.marker);
        assert_eq!(b.marker, c.marker);
        // Greys are grey.
        assert_eq!(c.color.0, c.color.1);
        assert!(target_rank("tensorwire", "shm") < target_rank("raw", "shm"));
        assert!(target_rank("ttrpc", "unix") < target_rank("grpc", "shm"));
    }
}
