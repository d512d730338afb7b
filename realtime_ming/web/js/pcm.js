/**
 * Wire audio helpers: base64 ⇄ bytes ⇄ PCM16. The Realtime wire carries little-endian PCM16;
 * typed arrays use the platform order, which is little-endian on every browser platform.
 */

const CHUNK = 0x8000; // String.fromCharCode argument limit stays far away

/** Bytes → base64. */
export function bytesToBase64(bytes) {
  let binary = "";
  for (let i = 0; i < bytes.length; i += CHUNK) {
    binary += String.fromCharCode.apply(null, bytes.subarray(i, i + CHUNK));
  }
  return btoa(binary);
}

/** base64 → bytes. */
export function base64ToBytes(b64) {
  const binary = atob(b64);
  const bytes = new Uint8Array(binary.length);
  for (let i = 0; i < binary.length; i++) bytes[i] = binary.charCodeAt(i);
  return bytes;
}

/** Int16Array → base64 PCM16 LE (the `audio` of input_audio_buffer.append). */
export function pcm16ToBase64(samples) {
  return bytesToBase64(new Uint8Array(samples.buffer, samples.byteOffset, samples.byteLength));
}

/** base64 PCM16 LE (the `delta` of response.output_audio.delta) → Int16Array. */
export function base64ToPcm16(b64) {
  const bytes = base64ToBytes(b64);
  return new Int16Array(bytes.buffer, 0, bytes.length >> 1);
}
