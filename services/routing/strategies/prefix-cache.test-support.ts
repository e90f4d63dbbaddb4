import { findStrategy } from "./registry.js";

export const registryHas = (name: string): boolean => findStrategy(name)?.name === name;
