// Float samples -> a 16-bit mono WAV file (a Blob).

export function encodeWav(chunks, sampleRate) {
  const total = chunks.reduce((n, c) => n + c.length, 0);
  const buffer = new ArrayBuffer(44 + total * 2);
  const view = new DataView(buffer);
  const ascii = (offset, s) => { for (let i = 0; i < s.length; i++) view.setUint8(offset + i, s.charCodeAt(i)); };
  ascii(0, "RIFF");
  view.setUint32(4, 36 + total * 2, true);
  ascii(8, "WAVE");
  ascii(12, "fmt ");
  view.setUint32(16, 16, true); // fmt chunk size
  view.setUint16(20, 1, true); // PCM
  view.setUint16(22, 1, true); // mono
  view.setUint32(24, sampleRate, true);
  view.setUint32(28, sampleRate * 2, true); // byte rate
  view.setUint16(32, 2, true); // block align
  view.setUint16(34, 16, true); // bits per sample
  ascii(36, "data");
  view.setUint32(40, total * 2, true);
  let pos = 44;
  for (const chunk of chunks) {
    for (let i = 0; i < chunk.length; i++, pos += 2) {
      // The inverse of the player's int16 / 32768, so 16-bit input comes back bit-exact.
      view.setInt16(pos, Math.max(-32768, Math.min(32767, Math.round(chunk[i] * 32768))), true);
    }
  }
  return new Blob([buffer], { type: "audio/wav" });
}
