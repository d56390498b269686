//! The PNG backend: plotters' bitmap backend with text drawn here from the
//! embedded DejaVu Sans, glyph by glyph with their side bearings and
//! kerning (plotters' own `ab_glyph` text drawing drops the side bearings,
//! which runs letters together: `cl` reads as `d`). Every other drawing
//! call goes to the bitmap backend unchanged.

use ab_glyph::{point, Font, FontRef, GlyphId, PxScale, ScaleFont};
use plotters::prelude::{BitMapBackend, DrawingBackend};
use plotters_backend::text_anchor::{HPos, VPos};
use plotters_backend::{
    BackendColor, BackendCoord, BackendStyle, BackendTextStyle, DrawingErrorKind,
};

/// The error type of the wrapped bitmap backend.
type BitmapError = <BitMapBackend<'static> as DrawingBackend>::ErrorType;

/// A bitmap backend whose text is drawn with the embedded font.
pub struct PngBackend<'a> {
    inner: BitMapBackend<'a>,
    font: FontRef<'static>,
}

impl<'a> PngBackend<'a> {
    /// Wraps a bitmap backend; `font` is a TrueType font's bytes.
    pub fn new(inner: BitMapBackend<'a>, font: &'static [u8]) -> Result<PngBackend<'a>, String> {
        let font = FontRef::try_from_slice(font).map_err(|e| format!("embedded font: {e}"))?;
        Ok(PngBackend { inner, font })
    }

    /// Glyphs of `text` at `size` px positioned from the layout box's top
    /// left, and the box's width and height.
    fn layout(&self, text: &str, size: f64) -> (Vec<ab_glyph::Glyph>, f32, f32) {
        let scale = PxScale::from(size.max(1.0) as f32);
        let f = self.font.as_scaled(scale);
        let ascent = f.ascent();
        let mut caret = 0f32;
        let mut prev: Option<GlyphId> = None;
        let mut glyphs = Vec::with_capacity(text.len());
        for c in text.chars() {
            let id = f.glyph_id(c);
            if let Some(p) = prev {
                caret += f.kern(p, id);
            }
            glyphs.push(id.with_scale_and_position(scale, point(caret, ascent)));
            caret += f.h_advance(id);
            prev = Some(id);
        }
        (glyphs, caret, ascent - f.descent())
    }
}

impl DrawingBackend for PngBackend<'_> {
    type ErrorType = BitmapError;

    fn get_size(&self) -> (u32, u32) {
        self.inner.get_size()
    }

    fn ensure_prepared(&mut self) -> Result<(), DrawingErrorKind<BitmapError>> {
        self.inner.ensure_prepared()
    }

    fn present(&mut self) -> Result<(), DrawingErrorKind<BitmapError>> {
        self.inner.present()
    }

    fn draw_pixel(
        &mut self,
        point: BackendCoord,
        color: BackendColor,
    ) -> Result<(), DrawingErrorKind<BitmapError>> {
        self.inner.draw_pixel(point, color)
    }

    fn draw_line<S: BackendStyle>(
        &mut self,
        from: BackendCoord,
        to: BackendCoord,
        style: &S,
    ) -> Result<(), DrawingErrorKind<BitmapError>> {
        self.inner.draw_line(from, to, style)
    }

    fn draw_rect<S: BackendStyle>(
        &mut self,
        upper_left: BackendCoord,
        bottom_right: BackendCoord,
        style: &S,
        fill: bool,
    ) -> Result<(), DrawingErrorKind<BitmapError>> {
        self.inner.draw_rect(upper_left, bottom_right, style, fill)
    }

    fn draw_path<S: BackendStyle, I: IntoIterator<Item = BackendCoord>>(
        &mut self,
        path: I,
        style: &S,
    ) -> Result<(), DrawingErrorKind<BitmapError>> {
        self.inner.draw_path(path, style)
    }

    fn draw_circle<S: BackendStyle>(
        &mut self,
        center: BackendCoord,
        radius: u32,
        style: &S,
        fill: bool,
    ) -> Result<(), DrawingErrorKind<BitmapError>> {
        self.inner.draw_circle(center, radius, style, fill)
    }

    fn fill_polygon<S: BackendStyle, I: IntoIterator<Item = BackendCoord>>(
        &mut self,
        vert: I,
        style: &S,
    ) -> Result<(), DrawingErrorKind<BitmapError>> {
        self.inner.fill_polygon(vert, style)
    }

    fn blit_bitmap(
        &mut self,
        pos: BackendCoord,
        size: (u32, u32),
        src: &[u8],
    ) -> Result<(), DrawingErrorKind<BitmapError>> {
        self.inner.blit_bitmap(pos, size, src)
    }

    fn estimate_text_size<T: BackendTextStyle>(
        &self,
        text: &str,
        style: &T,
    ) -> Result<(u32, u32), DrawingErrorKind<BitmapError>> {
        let (_, w, h) = self.layout(text, style.size());
        Ok((w.ceil().max(0.0) as u32, h.ceil().max(0.0) as u32))
    }

    fn draw_text<T: BackendTextStyle>(
        &mut self,
        text: &str,
        style: &T,
        pos: BackendCoord,
    ) -> Result<(), DrawingErrorKind<BitmapError>> {
        let color = style.color();
        if color.alpha == 0.0 {
            return Ok(());
        }
        let (glyphs, w, h) = self.layout(text, style.size());
        let anchor = style.anchor();
        let dx = match anchor.h_pos {
            HPos::Left => 0.0,
            HPos::Center => -w / 2.0,
            HPos::Right => -w,
        };
        let dy = match anchor.v_pos {
            VPos::Top => 0.0,
            VPos::Center => -h / 2.0,
            VPos::Bottom => -h,
        };
        let trans = style.transform();
        let mut pixels: Vec<(BackendCoord, f32)> = Vec::new();
        for g in glyphs {
            if let Some(outline) = self.font.outline_glyph(g) {
                let b = outline.px_bounds();
                let (ox, oy) = ((b.min.x + dx).round() as i32, (b.min.y + dy).round() as i32);
                outline.draw(|x, y, cov| {
                    if cov > 0.0 {
                        let (tx, ty) = trans.transform(ox + x as i32, oy + y as i32);
                        pixels.push(((pos.0 + tx, pos.1 + ty), cov.min(1.0)));
                    }
                });
            }
        }
        for (p, cov) in pixels {
            self.inner.draw_pixel(
                p,
                BackendColor {
                    alpha: color.alpha * f64::from(cov),
                    rgb: color.rgb,
                },
            )?;
        }
        Ok(())
    }
}
